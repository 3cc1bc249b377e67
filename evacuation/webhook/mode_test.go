package webhook

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestModeOf(t *testing.T) {
	cases := []struct {
		name       string
		auth       ClientAuth
		haveCA     bool
		seen       bool
		mode       Mode
		reason     string
		conditionT metav1.ConditionStatus
	}{
		{"auto, nothing seen yet: permissive", ClientAuthAuto, true, false, ModePermissive, ReasonNoAuthenticatedCallSeen, metav1.ConditionFalse},
		{"auto, an authenticated call seen: strict for good", ClientAuthAuto, true, true, ModeStrict, ReasonAuthenticatedCallSeen, metav1.ConditionTrue},
		{"auto without a CA: nothing can authenticate", ClientAuthAuto, false, false, ModePermissive, ReasonNoClientCA, metav1.ConditionFalse},
		{"auto without a CA, but the record says seen: strict", ClientAuthAuto, false, true, ModeStrict, ReasonAuthenticatedCallSeen, metav1.ConditionTrue},
		{"strict by flag", ClientAuthStrict, true, false, ModeStrict, ReasonStrictByFlag, metav1.ConditionTrue},
		{"strict by flag, seen too", ClientAuthStrict, true, true, ModeStrict, ReasonStrictByFlag, metav1.ConditionTrue},
	}
	seenAt := metav1.NewTime(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mode, reason := ModeOf(tc.auth, tc.haveCA, tc.seen)
			if mode != tc.mode || reason != tc.reason {
				t.Errorf("ModeOf() = %s, %s; want %s, %s", mode, reason, tc.mode, tc.reason)
			}
			var seen *metav1.Time
			if tc.seen {
				seen = &seenAt
			}
			c := ModeCondition(tc.auth, tc.haveCA, seen)
			if c.Type != v1alpha1.ConfigConditionEvictionWebhookStrict || c.Status != tc.conditionT || c.Reason != tc.reason || c.Message == "" {
				t.Errorf("ModeCondition() = %+v; want %s=%s, reason %s, with a message", c, v1alpha1.ConfigConditionEvictionWebhookStrict, tc.conditionT, tc.reason)
			}
			if tc.mode == ModePermissive && !strings.Contains(c.Message, "docs/operations.md") {
				t.Errorf("a permissive condition must say where to read what to change: %q", c.Message)
			}
		})
	}
}

// TestUnauthenticated: what a review the webhook cannot authenticate may cause is at most the
// mark of a VM to be live-migrated, once per interval unless its node is cordoned; every answer
// that changes nothing passes as Decide gave it.
func TestUnauthenticated(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *metav1.Time { return ptrTime(now.Add(-d)) }
	markedAt := func(d time.Duration, status metav1.ConditionStatus) vmiOpt {
		return func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.Conditions = append(v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: status,
				Reason: "APIEviction", LastTransitionTime: *ago(d)})
		}
	}
	migrated := func(start, end time.Duration) vmiOpt {
		return func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{StartTimestamp: ago(start), EndTimestamp: ago(end)}
		}
	}
	evacuating := Decision{Answer: AnswerEvacuating, Mark: true, Message: EvacuationText}
	const interval = time.Hour
	cases := []struct {
		name     string
		d        Decision
		vmi      *v1alpha1.VirtualMachineInstance
		cordoned bool
		want     Answer
		mark     bool
		contains string
	}{
		{"LiveMigrate, never evacuated: marked", evacuating, runningVMI(live, true), false, AnswerEvacuating, true, ""},
		{"LiveMigrateIfPossible, never evacuated: marked", evacuating, runningVMI(ifPossible, true), false, AnswerEvacuating, true, ""},
		{"External: never, its mark asks an outside controller to stop the VM", evacuating, runningVMI(external, true), false, AnswerBounded, false, "only for the API server"},
		{"External, even on a cordoned node", evacuating, runningVMI(external, true), true, AnswerBounded, false, "only for the API server"},
		{"migrated within the interval: not again", evacuating, runningVMI(live, true, migrated(30*time.Minute, 29*time.Minute)), false, AnswerBounded, false, "at most once every 1h0m0s"},
		{"mark cleared within the interval: not again", evacuating, runningVMI(live, true, markedAt(10*time.Minute, metav1.ConditionFalse)), false, AnswerBounded, false, "unless its node node-a is cordoned"},
		{"migration ended just inside the interval", evacuating, runningVMI(live, true, migrated(2*time.Hour, interval-time.Second)), false, AnswerBounded, false, ""},
		{"migration ended an interval ago: marked", evacuating, runningVMI(live, true, migrated(2*time.Hour, interval)), false, AnswerEvacuating, true, ""},
		{"last mark and migration long ago: marked", evacuating, runningVMI(live, true, markedAt(3*time.Hour, metav1.ConditionFalse), migrated(3*time.Hour, 2*time.Hour)), false, AnswerEvacuating, true, ""},
		{"within the interval, node cordoned (a drain): marked", evacuating, runningVMI(live, true, migrated(time.Minute, 0)), true, AnswerEvacuating, true, ""},
		{"a dry run is bounded alike, and marks nothing", Decision{Answer: AnswerEvacuating}, runningVMI(live, true, migrated(time.Minute, 0)), false, AnswerBounded, false, ""},
		{"allowed passes: the forger learns only the answer", Decision{Answer: AnswerAllowed}, runningVMI(none, true), false, AnswerAllowed, false, ""},
		{"in progress passes", Decision{Answer: AnswerInProgress, Message: "Evacuation in progress"}, runningVMI(live, true, alreadyMarked), false, AnswerInProgress, false, "in progress"},
		{"denied passes", Decision{Answer: AnswerDenied, Message: "cannot be live-migrated"}, runningVMI(live, false), false, AnswerDenied, false, "cannot"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			strategy := v1alpha1.EffectiveEvictionStrategy(tc.vmi, nil)
			got := Unauthenticated(tc.d, tc.vmi, strategy, tc.cordoned, interval, now)
			if got.Answer != tc.want || got.Mark != tc.mark || !strings.Contains(got.Message, tc.contains) {
				t.Errorf("Unauthenticated() = %+v; want %s, mark %v, a message containing %q", got, tc.want, tc.mark, tc.contains)
			}
			if got.Answer == AnswerBounded && (got.Allowed() || strings.Contains(got.Message, EvacuationText)) {
				t.Errorf("a bounded answer must be a 429 that promises no evacuation to the descheduler: %+v", got)
			}
		})
	}
}

func ptrTime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }

// TestAuthenticate: only a client certificate that chains to the CAs for client auth and has one of
// the names is the API server's.
func TestAuthenticate(t *testing.T) {
	ca, caKey := newTestCA(t, "cluster CA")
	other, otherKey := newTestCA(t, "another CA")
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	names := []string{"kube-apiserver-webhook-client"}
	state := func(c ...*x509.Certificate) *tls.ConnectionState { return &tls.ConnectionState{PeerCertificates: c} }
	cases := []struct {
		name     string
		state    *tls.ConnectionState
		roots    *x509.CertPool
		ok       bool
		contains string
	}{
		{"the API server's", state(newTestLeaf(t, ca, caKey, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)), roots, true, "kube-apiserver-webhook-client"},
		{"no TLS state", nil, roots, false, "no client certificate"},
		{"no client certificate", state(), roots, false, "no client certificate"},
		{"another CA's, with the right name", state(newTestLeaf(t, other, otherKey, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)), roots, false, "does not verify"},
		{"the CA's, another name (an admin's)", state(newTestLeaf(t, ca, caKey, "admin", x509.ExtKeyUsageClientAuth)), roots, false, "not in --webhook-client-names"},
		{"the CA's, for server auth only", state(newTestLeaf(t, ca, caKey, "kube-apiserver-webhook-client", x509.ExtKeyUsageServerAuth)), roots, false, "does not verify"},
		{"no CA to check against", state(newTestLeaf(t, ca, caKey, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)), nil, false, "no --webhook-client-ca"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			caller, ok := authenticate(tc.state, tc.roots, names)
			if ok != tc.ok || !strings.Contains(caller, tc.contains) {
				t.Errorf("authenticate() = %q, %v; want %v, containing %q", caller, ok, tc.ok, tc.contains)
			}
		})
	}
}

func newTestCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func newTestLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
