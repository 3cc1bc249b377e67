package check

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
)

var now = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// want checks a result's status and that its message says each of says.
func want(t *testing.T, got Result, status Status, says ...string) {
	t.Helper()
	if got.Status != status {
		t.Errorf("%s: status %s, want %s (%s)", got.Check, got.Status, status, got.Message)
	}
	for _, s := range says {
		if !strings.Contains(got.Message, s) {
			t.Errorf("%s: message %q does not say %q", got.Check, got.Message, s)
		}
	}
	if (status == Fail || status == Warn) && got.Fix == "" {
		t.Errorf("%s: a %s without a fix", got.Check, status)
	}
}

func TestCRD(t *testing.T) {
	established := []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}
	schema := func(spec map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.CustomResourceValidation {
		return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: spec}}}}
	}
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	crd := func(served bool, conds []apiextensionsv1.CustomResourceDefinitionCondition, spec map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1alpha1", Served: served, Schema: schema(spec)}}},
			Status: apiextensionsv1.CustomResourceDefinitionStatus{Conditions: conds},
		}
	}
	type kind struct {
		Spec struct {
			A string `json:"a"`
			B string `json:"b"`
		} `json:"spec"`
	}
	both := map[string]apiextensionsv1.JSONSchemaProps{"a": str, "b": str}
	for _, tc := range []struct {
		name   string
		crd    *apiextensionsv1.CustomResourceDefinition
		status Status
		says   string
	}{
		{"not installed", nil, Fail, "not installed"},
		{"not established", crd(true, nil, both), Fail, "not established"},
		{"version not served", crd(false, established, both), Fail, "v1alpha1 is not served"},
		{"older than the binary", crd(true, established, map[string]apiextensionsv1.JSONSchemaProps{"a": str}), Fail, "older than this kubectl-lifeboat: the served v1alpha1 schema lacks spec.b"},
		{"newer than the binary", crd(true, established, map[string]apiextensionsv1.JSONSchemaProps{"a": str, "b": str, "c": str}), Warn, "newer than this kubectl-lifeboat: the served v1alpha1 schema has spec.c"},
		{"as expected", crd(true, established, both), OK, "v1alpha1 served"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, CRD("kinds.lifeboat.dev", tc.crd, reflect.TypeFor[kind]()), tc.status, tc.says)
		})
	}
}

func TestController(t *testing.T) {
	lease := func(renewedAgo time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("replica-a"), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}}}
	}
	deployment := func(available int32) *appsv1.Deployment {
		return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2)}, Status: appsv1.DeploymentStatus{AvailableReplicas: available}}
	}
	for _, tc := range []struct {
		name       string
		lease      *coordinationv1.Lease
		deployment *appsv1.Deployment
		status     Status
		says       []string
	}{
		{"leading, all replicas", lease(2 * time.Second), deployment(2), OK, []string{"replica-a leads (Lease lifeboat-system/lifeboat-controller renewed 2s ago)", "2 of 2 replicas available"}},
		{"leading, a replica short", lease(2 * time.Second), deployment(1), Warn, []string{"1 of 2 replicas available"}},
		{"leading outside the cluster", lease(time.Second), nil, OK, []string{"it runs outside the cluster"}},
		{"lease expired", lease(time.Minute), deployment(2), Fail, []string{"none holds the Lease"}},
		{"no replica available", nil, deployment(0), Fail, []string{"0 of 2 replicas available: no migration"}},
		{"not installed", nil, nil, Fail, []string{"not installed"}},
	} {
		t.Run(tc.name, func(t *testing.T) { want(t, Controller(tc.lease, tc.deployment, now), tc.status, tc.says...) })
	}
}

func TestWebhook(t *testing.T) {
	config := func(cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.ValidatingWebhookConfiguration {
		return &admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "eviction.lifeboat.dev", ClientConfig: cc}}}
	}
	service := admissionregistrationv1.WebhookClientConfig{CABundle: []byte("ca"),
		Service: &admissionregistrationv1.ServiceReference{Namespace: "lifeboat-system", Name: "lifeboat-webhook"}}
	for _, tc := range []struct {
		name   string
		config *admissionregistrationv1.ValidatingWebhookConfiguration
		ready  *int
		status Status
		says   string
	}{
		{"not registered", nil, nil, Fail, "not registered: evictions of VM pods"},
		{"no CA bundle", config(admissionregistrationv1.WebhookClientConfig{Service: service.Service}), ptr.To(2), Fail, "without a CA bundle"},
		{"no Service", config(service), nil, Fail, "its Service lifeboat-system/lifeboat-webhook does not exist"},
		{"no ready endpoint", config(service), ptr.To(0), Fail, "has no ready endpoint: the API server cannot reach it"},
		{"reachable", config(service), ptr.To(2), OK, "has 2 ready endpoint(s)"},
		{"by URL", config(admissionregistrationv1.WebhookClientConfig{CABundle: []byte("ca"), URL: ptr.To("https://10.0.0.1:8443/validate-eviction")}), nil, OK, "not checked from here"},
	} {
		t.Run(tc.name, func(t *testing.T) { want(t, Webhook(tc.config, "eviction.lifeboat.dev", tc.ready), tc.status, tc.says) })
	}
}

func TestWebhookAuthentication(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cond   *metav1.Condition
		status Status
		says   string
	}{
		{"not recorded", nil, Unknown, "not recorded"},
		{"strict", &metav1.Condition{Status: metav1.ConditionTrue, Reason: "AuthenticatedCallSeen", Message: "seen"}, OK, "the API server authenticates (AuthenticatedCallSeen)"},
		{"permissive", &metav1.Condition{Status: metav1.ConditionFalse, Reason: "NoAuthenticatedCallSeen", Message: "not seen"}, Warn, "has not authenticated to it (NoAuthenticatedCallSeen)"},
	} {
		t.Run(tc.name, func(t *testing.T) { want(t, WebhookAuthentication(tc.cond), tc.status, tc.says) })
	}
}

func node(name string, kvm bool, labels ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if kvm {
		n.Labels[v1alpha1.LabelKVMNode] = "true"
	}
	for i := 0; i+1 < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

func agentPod(node string, ready bool) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}}
}

func vm(ns, name, node, memory string, mutate ...func(*v1alpha1.VirtualMachineInstance)) v1alpha1.VirtualMachineInstance {
	v := v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:   v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse(memory)},
		Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: node, Phase: v1alpha1.VMIRunning}}
	for _, m := range mutate {
		m(&v)
	}
	return v
}

func TestAgents(t *testing.T) {
	ds := &appsv1.DaemonSet{}
	for _, tc := range []struct {
		name    string
		ds      *appsv1.DaemonSet
		outside bool
		nodes   []corev1.Node
		pods    []corev1.Pod
		vmis    []v1alpha1.VirtualMachineInstance
		checks  []string
		status  []Status
		says    []string
	}{
		{"ready everywhere", ds, false, []corev1.Node{node("a", true), node("b", true), node("cp", false)}, []corev1.Pod{agentPod("a", true), agentPod("b", true)}, nil,
			[]string{"agents"}, []Status{OK}, []string{"ready on all 2 VM node(s)"}},
		{"no DaemonSet", nil, false, []corev1.Node{node("a", true)}, nil, nil, []string{"agents"}, []Status{Fail}, []string{"no DaemonSet lifeboat-system/lifeboat-agent: no node can run VMs"}},
		{"no DaemonSet, the controller outside the cluster", nil, true, []corev1.Node{node("a", true)}, nil, nil, []string{"agents"}, []Status{Unknown}, []string{"agents that run outside it too are not seen"}},
		{"the controller outside the cluster, a DaemonSet", ds, true, []corev1.Node{node("a", true)}, nil, nil, []string{"agent on node a"}, []Status{Fail}, []string{"no ready agent"}},
		{"not ready on a VM node", ds, false, []corev1.Node{node("a", true), node("b", true)}, []corev1.Pod{agentPod("a", true), agentPod("b", false)}, nil,
			[]string{"agent on node b"}, []Status{Fail}, []string{"no ready agent: VMs scheduled there will not start"}},
		{"VMs on a node without one", ds, false, []corev1.Node{node("a", true), node("b", false)}, []corev1.Pod{agentPod("a", true)}, []v1alpha1.VirtualMachineInstance{vm("ns", "web", "b", "1Gi")},
			[]string{"agent on node b"}, []Status{Fail}, []string{"yet 1 VM(s) run there (ns/web)", "not labelled lifeboat.dev/kvm=true"}},
		{"no VM node", ds, false, []corev1.Node{node("a", false)}, nil, nil, []string{"agents"}, []Status{Warn}, []string{"no node is labelled lifeboat.dev/kvm=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Agents(tc.nodes, tc.ds, tc.pods, tc.vmis, tc.outside)
			if len(got) != len(tc.checks) {
				t.Fatalf("got %+v, want %d result(s)", got, len(tc.checks))
			}
			for i := range got {
				if got[i].Check != tc.checks[i] {
					t.Errorf("check %q, want %q", got[i].Check, tc.checks[i])
				}
				want(t, got[i], tc.status[i], tc.says[i])
			}
		})
	}
}

func TestParseConfigz(t *testing.T) {
	// A kubelet with upstream defaults: no soft threshold, hard memory.available<100Mi.
	got, err := ParseConfigz([]byte(`{"kubeletconfig":{"evictionHard":{"imagefs.available":"15%","memory.available":"100Mi","nodefs.available":"10%"},"evictionPressureTransitionPeriod":"5m0s"}}`))
	if err != nil || *got != (KubeletEviction{HardMemory: "100Mi"}) {
		t.Errorf("got %+v, %v", got, err)
	}
	got, err = ParseConfigz([]byte(`{"kubeletconfig":{"evictionSoft":{"memory.available":"1Gi"},"evictionMaxPodGracePeriod":120}}`))
	if err != nil || *got != (KubeletEviction{SoftMemory: "1Gi", MaxPodGracePeriod: 120}) {
		t.Errorf("got %+v, %v", got, err)
	}
	if _, err := ParseConfigz([]byte(`{}`)); err == nil {
		t.Error("an answer without kubeletconfig parsed")
	}
}

func TestSoftEvictionGrace(t *testing.T) {
	for _, tc := range []struct{ max, pod, want int64 }{{120, 45, 45}, {30, 45, 30}, {0, 45, 1}} {
		if got := SoftEvictionGrace(tc.max, tc.pod); got != tc.want {
			t.Errorf("SoftEvictionGrace(%d, %d) = %d, want %d", tc.max, tc.pod, got, tc.want)
		}
	}
}

func TestNodeEviction(t *testing.T) {
	on := Protection{Gate: true, Margin: "512Mi", Bandwidth: 64 << 20}
	relief := on
	relief.Relief = true
	uncapped := on
	uncapped.Bandwidth = 0
	soft := &KubeletEviction{SoftMemory: "1Gi", HardMemory: "100Mi", MaxPodGracePeriod: 120}
	short := &KubeletEviction{SoftMemory: "1Gi", HardMemory: "100Mi", MaxPodGracePeriod: 10}
	upstream := &KubeletEviction{HardMemory: "100Mi"}
	// The pod's grace is the guest's default 30s and lifeboat's margin of 15s.
	big := vm("ns", "big", "n", "2Gi")
	small := vm("ns", "small", "n", "512Mi")
	vms := []*v1alpha1.VirtualMachineInstance{&small, &big}
	for _, tc := range []struct {
		name    string
		kubelet *KubeletEviction
		vms     []*v1alpha1.VirtualMachineInstance
		p       Protection
		status  Status
		says    []string
	}{
		{"configz not served", nil, vms, on, Unknown, []string{"not served through the API server (no kubelet API)", "relief off"}},
		{"gate off", soft, vms, Protection{}, Warn, []string{"feature gate NodePressureEvictionLiveMigration is off"}},
		{"upstream defaults", upstream, vms, on, Warn, []string{"no soft memory.available threshold: at its hard memory.available<100Mi the kubelet kills a VM pod with no grace (1s)", "relief off"}},
		{"upstream defaults with relief", upstream, vms, relief, OK, []string{"relief on (margin 512Mi): relief moves VMs before the threshold"}},
		{"the largest VM migrates in time", soft, vms, on, OK, []string{"the largest VM there, ns/big (2Gi), gets 45s", "copying its memory once takes 32s"}},
		{"the largest VM cannot migrate in time", short, vms, on, Fail, []string{"ns/big (2Gi), gets 10s, but copying its memory once takes 32s at bandwidthPerMigration 64Mi/s: it would be lost"}},
		{"no bandwidth cap", short, vms, uncapped, OK, []string{"gets 10s (migrations have no bandwidth cap"}},
		{"no VM", soft, nil, on, OK, []string{"a VM pod gets up to 120s; no VM runs there"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, NodeEviction("n", tc.kubelet, "no kubelet API", tc.vms, tc.p), tc.status, tc.says...)
		})
	}
}

// csr is a migration certificate request for node, issued for life from notBefore unless
// conditions say otherwise.
func csr(t *testing.T, node string, created time.Time, notBefore time.Time, life time.Duration, conds ...certificatesv1.CertificateSigningRequestCondition) certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: migrationtls.CommonName(node)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	c := certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-" + node, CreationTimestamp: metav1.NewTime(created)},
		Spec:   certificatesv1.CertificateSigningRequestSpec{SignerName: migrationtls.SignerName, Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req})},
		Status: certificatesv1.CertificateSigningRequestStatus{Conditions: conds}}
	if life > 0 {
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: notBefore, NotAfter: notBefore.Add(life)},
			&x509.Certificate{SerialNumber: big.NewInt(1)}, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		c.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	return c
}

func TestNodeCertificates(t *testing.T) {
	day := 24 * time.Hour
	denied := certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "NotTheNode", Message: "the requester is not the node's agent"}
	for _, tc := range []struct {
		name   string
		csr    certificatesv1.CertificateSigningRequest
		check  string
		status Status
		says   string
	}{
		{"valid", csr(t, "a", now.Add(-time.Hour), now.Add(-time.Hour), day), "node certificates", OK, "valid on all 1 VM node(s)"},
		{"expired", csr(t, "a", now.Add(-2*day), now.Add(-2*day), day), "node a certificate", Fail, "expired at 2026-11-26T12:00:00Z"},
		{"not renewed", csr(t, "a", now.Add(-23*time.Hour), now.Add(-23*time.Hour), day), "node a certificate", Warn, "is not renewed"},
		{"denied", csr(t, "a", now.Add(-time.Minute), now, 0, denied), "node a certificate", Fail, "Denied (NotTheNode): the requester is not the node's agent"},
		{"pending for long", csr(t, "a", now.Add(-10*time.Minute), now, 0), "node a certificate", Warn, "still pending after 10m0s"},
		{"pending for a moment", csr(t, "a", now.Add(-time.Minute), now, 0), "node certificates", OK, "valid on all"},
		{"not listed", csr(t, "other", now, now, day), "node certificates", Unknown, "no migration certificate request listed for 1 node(s) (a)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeCertificates([]string{"a"}, []certificatesv1.CertificateSigningRequest{tc.csr}, now)
			if len(got) != 1 || got[0].Check != tc.check {
				t.Fatalf("got %+v, want one result for %q", got, tc.check)
			}
			want(t, got[0], tc.status, tc.says)
		})
	}
}

func TestPodSecurity(t *testing.T) {
	ns := func(name, level string) corev1.Namespace {
		n := corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if level != "" {
			n.Labels[LabelPodSecurityEnforce] = level
		}
		return n
	}
	nodePath := func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Boot.Kernel = "/srv/vmlinuz" }
	for _, tc := range []struct {
		name   string
		ns     corev1.Namespace
		vmis   []v1alpha1.VirtualMachineInstance
		check  string
		status Status
		says   string
	}{
		{"restricted", ns("vms", "restricted"), []v1alpha1.VirtualMachineInstance{vm("vms", "a", "n", "1Gi")}, "VM namespaces' Pod Security", OK, "all 1 VM namespace(s) enforce restricted"},
		{"no level", ns("vms", ""), []v1alpha1.VirtualMachineInstance{vm("vms", "a", "n", "1Gi")}, "namespace vms Pod Security", Warn, "enforces none (the cluster's default), not restricted"},
		{"privileged", ns("vms", "privileged"), []v1alpha1.VirtualMachineInstance{vm("vms", "a", "n", "1Gi")}, "namespace vms Pod Security", Warn, "enforces privileged"},
		{"privileged for node paths", ns("lab", "privileged"), []v1alpha1.VirtualMachineInstance{vm("lab", "a", "n", "1Gi", nodePath)}, "VM namespaces' Pod Security", OK, "0 of 1 VM namespace(s) enforce restricted; the others' VMs boot from node paths"},
		{"no VM there", ns("apps", ""), nil, "VM namespaces' Pod Security", OK, "all 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PodSecurity([]corev1.Namespace{tc.ns}, tc.vmis)
			if len(got) != 1 || got[0].Check != tc.check {
				t.Fatalf("got %+v, want one result for %q", got, tc.check)
			}
			want(t, got[0], tc.status, tc.says)
		})
	}
}

func TestMigratable(t *testing.T) {
	nodes := []corev1.Node{node("a", true, "zone", "1"), node("b", true, "zone", "2"), node("c", true, "zone", "2")}
	nodes[2].Spec.Unschedulable = true
	strategy := func(s v1alpha1.EvictionStrategy) func(*v1alpha1.VirtualMachineInstance) {
		return func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = &s }
	}
	selector := func(k, v string) func(*v1alpha1.VirtualMachineInstance) {
		return func(vmi *v1alpha1.VirtualMachineInstance) { vmi.Spec.NodeSelector = map[string]string{k: v} }
	}
	notMigratable := func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: "DisksNotLiveMigratable", Message: "disk data is a ReadWriteOnce claim"}}
	}
	noTarget := func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: v1alpha1.VMIReasonNoTargetNode,
			Message: "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector zone=1"}}
	}
	for _, tc := range []struct {
		name   string
		vmi    v1alpha1.VirtualMachineInstance
		check  string
		status Status
		says   string
	}{
		{"free to move", vm("ns", "web", "a", "1Gi", strategy(v1alpha1.EvictionStrategyLiveMigrate)), "VMs", OK, "all 1 running VM(s) can live-migrate"},
		{"pinned, must migrate", vm("ns", "db", "a", "1Gi", strategy(v1alpha1.EvictionStrategyLiveMigrate), selector("zone", "1")), "VM ns/db", Fail,
			"on node a cannot live-migrate (pinned: no other node labelled lifeboat.dev/kvm=true matches its nodeSelector zone=1); eviction strategy LiveMigrate: a drain of its node waits for ever"},
		{"pinned, and its condition says so already: said once", vm("ns", "db", "a", "1Gi", strategy(v1alpha1.EvictionStrategyLiveMigrate), selector("zone", "1"), noTarget), "VM ns/db", Fail,
			"on node a cannot live-migrate (NoTargetNode: no other node labelled lifeboat.dev/kvm=true matches its nodeSelector zone=1); eviction strategy LiveMigrate"},
		{"pinned where the other node is cordoned", vm("ns", "db", "b", "1Gi", strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible), selector("zone", "2")), "VM ns/db", Warn, "it shuts down instead of migrating"},
		{"not migratable", vm("ns", "db", "a", "1Gi", notMigratable), "VM ns/db", Warn, "(DisksNotLiveMigratable: disk data is a ReadWriteOnce claim); eviction strategy None"},
		{"not running", vm("ns", "db", "", "1Gi", selector("zone", "1")), "VMs", OK, "all 0 running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Migratable([]v1alpha1.VirtualMachineInstance{tc.vmi}, nodes, nil)
			if len(got) != 1 || got[0].Check != tc.check {
				t.Fatalf("got %+v, want one result for %q", got, tc.check)
			}
			want(t, got[0], tc.status, tc.says)
		})
	}
}

func TestStuck(t *testing.T) {
	mig := func(age time.Duration, phase v1alpha1.VirtualMachineInstanceMigrationPhase) v1alpha1.VirtualMachineInstanceMigration {
		return v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "web"}, Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase}}
	}
	for _, tc := range []struct {
		name   string
		m      v1alpha1.VirtualMachineInstanceMigration
		check  string
		status Status
		says   string
	}{
		{"running briefly", mig(time.Minute, v1alpha1.MigrationRunning), "migrations", OK, "1 in flight, none older than 15m0s"},
		{"running for long", mig(time.Hour, v1alpha1.MigrationRunning), "migration ns/m", Fail, "of VMI web still Running after 1h0m0s"},
		{"never picked up", mig(time.Hour, ""), "migration ns/m", Fail, "still not yet picked up by the controller"},
		{"ended long ago", mig(time.Hour, v1alpha1.MigrationFailed), "migrations", OK, "0 in flight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Stuck([]v1alpha1.VirtualMachineInstanceMigration{tc.m}, 15*time.Minute, now)
			if len(got) != 1 || got[0].Check != tc.check {
				t.Fatalf("got %+v, want one result for %q", got, tc.check)
			}
			want(t, got[0], tc.status, tc.says)
		})
	}
}

func TestReportFailed(t *testing.T) {
	if (Report{Results: []Result{{Status: OK}, {Status: Warn}, {Status: Unknown}}}).Failed() {
		t.Error("a report without a failure failed")
	}
	if !(Report{Results: []Result{{Status: OK}, {Status: Fail}}}).Failed() {
		t.Error("a report with a failure did not fail")
	}
}

func TestOutside(t *testing.T) {
	held := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("host_1"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &metav1.MicroTime{Time: now}}}
	for _, tc := range []struct {
		name       string
		lease      *coordinationv1.Lease
		deployment *appsv1.Deployment
		want       bool
	}{
		{"leading without a Deployment", held, nil, true},
		{"leading from the Deployment", held, &appsv1.Deployment{}, false},
		{"nobody leads", nil, nil, false},
	} {
		if got := Outside(tc.lease, tc.deployment, now); got != tc.want {
			t.Errorf("%s: Outside = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestProxyError(t *testing.T) {
	refused := apierrors.NewGenericServerResponse(400, "get", schema.GroupResource{Resource: "nodes"}, "node-1", "", 0, true)
	if got := proxyError(refused, []byte("address not allowed\n")); got != "HTTP 400: address not allowed" {
		t.Errorf("a plain-text refusal: %q", got)
	}
	// What kube-apiserver answers for a node at a loopback address.
	body := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"address not allowed","reason":"BadRequest","code":400}`)
	if got := proxyError(refused, body); got != "HTTP 400: address not allowed" {
		t.Errorf("a Status: %q", got)
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes/proxy"}, "node-1", errors.New("no"))
	if got := proxyError(forbidden, []byte(`{"kind":"Status"}`)); got != forbidden.Error() {
		t.Errorf("a Status without a message: %q, want the API error", got)
	}
}

func TestControlNodes(t *testing.T) {
	node := func(name string, labels map[string]string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	kvm := map[string]string{v1alpha1.LabelKVMNode: "true"}
	for _, tc := range []struct {
		name   string
		nodes  []corev1.Node
		status Status
		says   string
	}{
		{"a node without VMs", []corev1.Node{node("cp", nil), node("vm-1", kvm)}, OK, "1 node(s) not labelled lifeboat.dev/kvm=true for the controller and the signer: cp"},
		{"a node labelled false", []corev1.Node{node("spare", map[string]string{v1alpha1.LabelKVMNode: "false"}), node("vm-1", kvm)}, OK, ": spare"},
		{"only VM nodes", []corev1.Node{node("vm-1", kvm), node("vm-2", kvm)}, Fail,
			"every node (2) is labelled lifeboat.dev/kvm=true: the Deployments lifeboat-system/lifeboat-controller and lifeboat-system/lifeboat-signer keep off VM nodes and have nowhere to run"},
		{"no nodes", nil, Fail, "every node (0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ControlNodes(tc.nodes)
			if got.Status != tc.status || !strings.Contains(got.Message, tc.says) {
				t.Errorf("%s: %s, want %s saying %q", got.Status, got.Message, tc.status, tc.says)
			}
			if (got.Status == Fail) != (got.Fix != "") {
				t.Errorf("fix %q for status %s: want one exactly when it fails", got.Fix, got.Status)
			}
		})
	}
}
