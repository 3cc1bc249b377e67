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

// TestRejectedWriteIsReportedAndRetried: when the API server refuses lifeboat's status, sync
// fails (so the worker retries it with backoff), the refusal is counted by its reason and told
// on the Eviction with the server's words.
func TestRejectedWriteIsReportedAndRetried(t *testing.T) {
	ev := eviction(lifecyclev1alpha1.ResponderStateActive, started())
	pod := launcherPod(corev1.PodRunning)
	v := vm(withStrategy(v1alpha1.EvictionStrategyNone))
	pod.Labels = map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIUID: string(v.UID)}
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(v, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
	ev.Spec.Target.Pod = &lifecyclev1alpha1.EvictionPodReference{Name: pod.Name, UID: pod.UID}

	kube := kubefake.NewClientset()
	rejection := apierrors.NewInvalid(schema.GroupKind{Group: "lifecycle.k8s.io", Kind: "Eviction"}, ev.Name,
		field.ErrorList{field.Invalid(field.NewPath("status", "responders").Index(0).Child("heartbeatTime"), "", "must be set to the present time")})
	kube.PrependReactor("patch", "evictions", func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, rejection })
	kubeInformers := informers.NewSharedInformerFactory(kube, 0)
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lifeboatfake.NewSimpleClientset(), 0)
	lb := lbInformers.Lifeboat().V1alpha1()
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

	_, err = c.sync(context.Background(), "ns/ev")
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
