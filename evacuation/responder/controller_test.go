package responder

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// fixture is a responder on fake clients whose caches hold a None VM's launcher pod and its
// Eviction, lifeboat Active; reactor answers its status writes.
func fixture(t *testing.T, reactor clienttesting.ReactionFunc) (*Controller, *kubefake.Clientset, *record.FakeRecorder, *Metrics) {
	t.Helper()
	ev := eviction(lifecyclev1alpha1.ResponderStateActive, started())
	pod := launcherPod(corev1.PodRunning)
	v := vm(withStrategy(v1alpha1.EvictionStrategyNone))
	pod.Labels = map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIUID: string(v.UID)}
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(v, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
	ev.Spec.Target.Pod = &lifecyclev1alpha1.EvictionPodReference{Name: pod.Name, UID: pod.UID}

	kube := kubefake.NewClientset()
	kube.PrependReactor("patch", "evictions", reactor)
	kubeInformers := informers.NewSharedInformerFactory(kube, 0)
	lb := lifeboatinformers.NewSharedInformerFactory(lifeboatfake.NewSimpleClientset(), 0).Lifeboat().V1alpha1()
	inf := Informers{Evictions: kubeInformers.Lifecycle().V1alpha1().Evictions(), Pods: kubeInformers.Core().V1().Pods(),
		VMIs: lb.VirtualMachineInstances(), Migrations: lb.VirtualMachineInstanceMigrations(), Configs: lb.LifeboatConfigs()}
	recorder := record.NewFakeRecorder(10)
	metrics := NewMetrics(prometheus.NewRegistry())
	c, err := New(kube, lifeboatfake.NewSimpleClientset(), inf, recorder, metrics, Settings{Min: MinHeartbeatInterval, Max: MaxHeartbeatInterval},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return t0 }
	for _, add := range []error{
		inf.Evictions.Informer().GetStore().Add(ev), inf.Pods.Informer().GetStore().Add(pod), inf.VMIs.Informer().GetStore().Add(v),
	} {
		if add != nil {
			t.Fatal(add)
		}
	}
	return c, kube, recorder, metrics
}

// TestRejectedWriteIsReportedAndRetried: when the API server refuses lifeboat's status, sync
// fails (so the worker retries it with backoff), the refusal is counted by its reason and told
// on the Eviction with the server's words.
func TestRejectedWriteIsReportedAndRetried(t *testing.T) {
	rejection := apierrors.NewInvalid(schema.GroupKind{Group: "lifecycle.k8s.io", Kind: "Eviction"}, "ev",
		field.ErrorList{field.Invalid(field.NewPath("status", "responders").Index(0).Child("heartbeatTime"), "", "must be set to the present time")})
	c, _, recorder, metrics := fixture(t, func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, rejection })

	_, err := c.sync(context.Background(), "ns/ev")
	if !apierrors.IsInvalid(err) {
		t.Fatalf("sync = %v: want the server's rejection, so the key is retried", err)
	}
	if n := testutil.ToFloat64(metrics.WriteFailures.WithLabelValues(string(metav1.StatusReasonInvalid))); n != 1 {
		t.Errorf("write failures (Invalid) = %v, want 1", n)
	}
	if n := testutil.ToFloat64(metrics.Answered.WithLabelValues(OutcomeDeclined)); n != 0 {
		t.Errorf("a refused answer is not an answer: declined = %v", n)
	}
	select {
	case e := <-recorder.Events:
		if !strings.Contains(e, ReasonRejectedByServer) || !strings.Contains(e, "must be set to the present time") {
			t.Errorf("event %q: want %s with the server's reason", e, ReasonRejectedByServer)
		}
	default:
		t.Error("no Event on the Eviction about the refused write")
	}
}

// TestLaggingCacheDoesNotRepeatAWrite: right after lifeboat declines, its cache still shows the
// Eviction without completionTime; a sync then (another object's event) must not answer again,
// which the API server would refuse (completionTime is immutable) or count twice.
func TestLaggingCacheDoesNotRepeatAWrite(t *testing.T) {
	written := eviction(lifecyclev1alpha1.ResponderStateActive, started())
	Entry(written).HeartbeatTime, Entry(written).CompletionTime = at(0), at(0)
	c, kube, _, metrics := fixture(t, func(clienttesting.Action) (bool, runtime.Object, error) { return true, written, nil })
	for i := range 2 {
		c.now = func() time.Time { return t0.Add(time.Duration(i) * 2 * time.Second) }
		if _, err := c.sync(context.Background(), "ns/ev"); err != nil {
			t.Fatal(err)
		}
	}
	patches := 0
	for _, a := range kube.Actions() {
		if a.GetVerb() == "patch" {
			patches++
		}
	}
	if patches != 1 {
		t.Errorf("%d status writes, want 1: the second sync must see lifeboat's own answer", patches)
	}
	if n := testutil.ToFloat64(metrics.Answered.WithLabelValues(OutcomeDeclined)); n != 1 {
		t.Errorf("declined = %v, want 1", n)
	}
}
