package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// callers: the CAs the webhook trusts and what the API server presents (a forger presents nothing).
type callers struct {
	roots     *x509.CertPool
	apiServer *tls.ConnectionState
}

func newCallers(t *testing.T) callers {
	ca, key := newTestCA(t, "cluster CA")
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	leaf := newTestLeaf(t, ca, key, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)
	return callers{roots: roots, apiServer: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}}
}

// startServer is a webhook on fake clients, its caches synced, not listening: tests call ServeHTTP.
func startServer(t *testing.T, c callers, lb *lifeboatfake.Clientset, kube *kubefake.Clientset) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kubeInformers := informers.NewSharedInformerFactory(kube, 0)
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	nodes := kubeInformers.Core().V1().Nodes().Informer()
	s, err := New(kube, lb, kubeInformers.Core().V1().Pods(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), nodes,
		record.NewFakeRecorder(100), Options{Endpoint: Endpoint{URL: "https://127.0.0.1:1" + Path}, CertValidity: time.Hour,
			ClientCAs: c.roots, ClientNames: []string{"kube-apiserver-webhook-client"}, ClientAuth: ClientAuthAuto},
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		t.Fatal("caches did not sync")
	}
	s.runCtx = ctx
	return s
}

// review posts an eviction review of ns/name as a caller presenting state (nil: nothing); it
// returns the HTTP status and, for 200, the response.
func review(t *testing.T, s *Server, state *tls.ConnectionState, ns, name string) (int, *admissionv1.AdmissionResponse) {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u", Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			SubResource: "eviction", Operation: admissionv1.Create, Namespace: ns, Name: name}})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(string(body)))
	r.TLS = state
	if r.TLS == nil {
		r.TLS = &tls.ConnectionState{}
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		return w.Code, nil
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("answer %q: %v", w.Body.String(), err)
	}
	return w.Code, out.Response
}

// launcherOf is a running VMI's launcher pod, as the VMI controller makes it.
func launcherOf(v *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: v.Namespace, Name: "launcher-" + v.Name,
			Labels: map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIName: v.Name, v1alpha1.LabelVMIUID: string(v.UID)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "VirtualMachineInstance",
				Name: v.Name, UID: v.UID, Controller: ptrBool(true)}}},
		Spec:   corev1.PodSpec{NodeName: v.Status.NodeName},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func ptrBool(b bool) *bool { return &b }

// TestTheRatchet: permissive, the webhook reads and answers a review without the API server's
// certificate; after one call that presents it, it refuses such reviews (403), and so does a new
// server (a restart, another replica) reading the record from the LifeboatConfig.
func TestTheRatchet(t *testing.T) {
	c := newCallers(t)
	vmi := runningVMI(live, true)
	vmi.UID = "uid-1"
	config := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
	lb := lifeboatfake.NewSimpleClientset(vmi, config)
	kube := kubefake.NewClientset(launcherOf(vmi), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	s := startServer(t, c, lb, kube)

	code, answer := review(t, s, nil, "ns", "not-a-launcher")
	if code != http.StatusOK || !answer.Allowed {
		t.Fatalf("permissive, a review without a certificate: %d %+v, want it read and allowed (not a VM's pod)", code, answer)
	}
	if got := testutil.ToFloat64(s.metrics.mode.WithLabelValues(string(ModePermissive))); got != 1 {
		t.Errorf("mode metric permissive = %v, want 1", got)
	}
	if code, _ := review(t, s, c.apiServer, "ns", "not-a-launcher"); code != http.StatusOK {
		t.Fatalf("the API server's review: %d, want 200", code)
	}
	got, err := lb.LifeboatV1alpha1().LifeboatConfigs().Get(context.Background(), v1alpha1.ConfigName, metav1.GetOptions{})
	if err != nil || seenInConfig(got) == nil {
		t.Fatalf("want the first authenticated call recorded in the LifeboatConfig: %+v, %v", got.Status, err)
	}
	if got := testutil.ToFloat64(s.metrics.mode.WithLabelValues(string(ModeStrict))); got != 1 {
		t.Errorf("mode metric strict = %v, want 1", got)
	}
	if code, _ := review(t, s, nil, vmi.Namespace, "launcher-"+vmi.Name); code != http.StatusForbidden {
		t.Errorf("after the API server authenticated, a review without a certificate: %d, want 403", code)
	}
	if n := testutil.ToFloat64(s.metrics.unauthenticated); n != 1 {
		t.Errorf("refused reviews = %v, want 1", n)
	}

	// Another replica, or this one restarted: the record alone makes it strict.
	other := startServer(t, c, lb, kube)
	if code, _ := review(t, other, nil, vmi.Namespace, "launcher-"+vmi.Name); code != http.StatusForbidden {
		t.Errorf("a new server reading the record, a review without a certificate: %d, want 403", code)
	}
	if v, _ := lb.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Get(context.Background(), vmi.Name, metav1.GetOptions{}); v.MarkedForEvacuation() {
		t.Errorf("a refused review marked the VM: %+v", v.Status)
	}
}

// TestAPermissiveWebhookMarksOnce: a review without a certificate marks a LiveMigrate VM (no
// deadline), and a review right after its evacuation is bounded.
func TestAPermissiveWebhookMarksOnce(t *testing.T) {
	c := newCallers(t)
	vmi := runningVMI(live, true)
	vmi.UID = "uid-1"
	lb := lifeboatfake.NewSimpleClientset(vmi, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}})
	kube := kubefake.NewClientset(launcherOf(vmi), vmNode("node-a"), vmNode("node-b"))
	s := startServer(t, c, lb, kube)

	_, answer := review(t, s, nil, vmi.Namespace, "launcher-"+vmi.Name)
	if answer.Allowed || !strings.Contains(answer.Result.Message, EvacuationText) {
		t.Fatalf("a forged review in permissive mode: %+v, want 429 %q", answer, EvacuationText)
	}
	v, err := lb.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Get(context.Background(), vmi.Name, metav1.GetOptions{})
	if err != nil || !v.MarkedForEvacuation() || v.Status.EvacuationDeadline != nil {
		t.Fatalf("want the VM marked without a deadline: %+v, %v", v.Status, err)
	}

	// The cache must hold the mark before it is cleared: the VMI it held before the mark is
	// unmarked too, and a review answered while the mark's event is still on its way sees the
	// VM in progress.
	cached := func(context.Context) (*v1alpha1.VirtualMachineInstance, error) {
		return s.vmis.VirtualMachineInstances(v.Namespace).Get(v.Name)
	}
	kubewait.For(t, 10*time.Second, "the webhook's cache to hold the mark", cached, (*v1alpha1.VirtualMachineInstance).MarkedForEvacuation, nil)

	// The evacuation ends a moment later (the migration's work): the mark is cleared.
	v1alpha1.ClearEvacuationMark(&v.Status, "Migrated", "moved", metav1.Now())
	if _, err := lb.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).UpdateStatus(context.Background(), v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubewait.For(t, 10*time.Second, "the webhook's cache to see the mark cleared", cached,
		func(v *v1alpha1.VirtualMachineInstance) bool { return !v.MarkedForEvacuation() }, nil)
	_, answer = review(t, s, nil, vmi.Namespace, "launcher-"+vmi.Name)
	if answer.Allowed || !strings.Contains(answer.Result.Message, "at most once every") {
		t.Errorf("a second forged review within the interval: %+v, want 429 bounded", answer)
	}
	if v, _ := lb.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Get(context.Background(), vmi.Name, metav1.GetOptions{}); v.MarkedForEvacuation() {
		t.Errorf("a bounded review marked the VM again: %+v", v.Status)
	}
}

// vmNode is a node lifeboat runs VMs on.
func vmNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelKVMNode: "true", corev1.LabelHostname: name}}}
}

// TestAVMNoNodeCanTakeIsAnsweredAtOnce: the webhook decides on the nodes as they stand, not only
// on the LiveMigratable condition the evacuation controller writes: a VM pinned to its node whose
// condition still says True is answered as one that cannot migrate (issue 44 item 4), and no
// mark starts a migration that could only wait.
func TestAVMNoNodeCanTakeIsAnsweredAtOnce(t *testing.T) {
	c := newCallers(t)
	pinned := func(strategy *v1alpha1.EvictionStrategy, name string) *v1alpha1.VirtualMachineInstance {
		v := runningVMI(strategy, true, func(v *v1alpha1.VirtualMachineInstance) {
			v.Name, v.UID = name, types.UID("uid-"+name)
			v.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "node-a"}
		})
		return v
	}
	lm, lmip, ext := pinned(live, "lm"), pinned(ifPossible, "lmip"), pinned(external, "ext")
	lb := lifeboatfake.NewSimpleClientset(lm, lmip, ext, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}})
	kube := kubefake.NewClientset(launcherOf(lm), launcherOf(lmip), launcherOf(ext), vmNode("node-a"), vmNode("node-b"))
	s := startServer(t, c, lb, kube)
	marked := func(name string) bool {
		v, err := lb.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && v.MarkedForEvacuation()
	}

	_, answer := review(t, s, c.apiServer, "ns", "launcher-lm")
	want := `cannot be live-migrated (NoTargetNode: no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=node-a)`
	if answer.Allowed || answer.Result.Code != http.StatusTooManyRequests || !strings.Contains(answer.Result.Message, want) {
		t.Errorf("LiveMigrate: %+v, want 429 saying %q", answer.Result, want)
	}
	if marked("lm") {
		t.Error("LiveMigrate: marked for a migration no node can take")
	}
	if _, answer = review(t, s, c.apiServer, "ns", "launcher-lmip"); !answer.Allowed {
		t.Errorf("LiveMigrateIfPossible: %+v, want allowed (an ordinary eviction, seed 000)", answer.Result)
	}
	if marked("lmip") {
		t.Error("LiveMigrateIfPossible: marked")
	}
	if _, answer = review(t, s, c.apiServer, "ns", "launcher-ext"); answer.Allowed || !strings.Contains(answer.Result.Message, EvacuationText) {
		t.Errorf("External: %+v, want 429 %q as always", answer.Result, EvacuationText)
	}
	if !marked("ext") {
		t.Error("External: not marked")
	}
}
