package responder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/evictionrequest"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

var cluster *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cluster, controlplane.Options{}) }

// testSettings are short heartbeat intervals, so the tests see several heartbeats in seconds.
var testSettings = Settings{Min: 2 * time.Second, Max: 4 * time.Second}

// startResponder runs the responder in this process against the real API server.
func startResponder(t *testing.T) *Metrics {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := v1alpha1.AddToScheme(scheme.Scheme); err != nil {
		t.Fatal(err)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cluster.Kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lifeboat-responder-test"})

	evInformers := informers.NewSharedInformerFactoryWithOptions(cluster.Kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = EvictionSelector }))
	podInformers := informers.NewSharedInformerFactoryWithOptions(cluster.Kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbFactory := lifeboatinformers.NewSharedInformerFactory(cluster.Lifeboat, 0)
	lb := lbFactory.Lifeboat().V1alpha1()
	metrics := NewMetrics(prometheus.NewRegistry())
	c, err := New(cluster.Kube, cluster.Lifeboat, Informers{
		Evictions: evInformers.Lifecycle().V1alpha1().Evictions(), Pods: podInformers.Core().V1().Pods(),
		VMIs: lb.VirtualMachineInstances(), Migrations: lb.VirtualMachineInstanceMigrations(), Configs: lb.LifeboatConfigs(),
	}, recorder, metrics, Settings{Min: MinHeartbeatInterval, Max: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c.settings = testSettings
	evInformers.Start(ctx.Done())
	podInformers.Start(ctx.Done())
	lbFactory.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, 2); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		broadcaster.Shutdown()
	})
	return metrics
}

const node = "node-a"

// runningVM plays the VMI controller and the agent: a VMI running on node with its launcher pod,
// built as the VMI controller builds it where the EvictionRequest API is served.
func runningVM(t *testing.T, strategy v1alpha1.EvictionStrategy) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	ns, err := cluster.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "responder-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpEvents(t, ns.Name)
		}
	})
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns.Name)
	v, err := vmis.Create(ctx, &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse("128Mi"), EvictionStrategy: ptr.To(strategy),
			Boot: v1alpha1.BootSource{Kernel: "/images/vmlinuz"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, node
	v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable", LastTransitionTime: metav1.Now()}}
	if v, err = vmis.UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := vmi.NewLauncherPod(v, vmi.PodOptions{Image: "lifeboat-launcher:test", Acceleration: "tcg", EvictionResponder: true}, []string{"/images"})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.NodeName = node
	if pod, err = cluster.Kube.CoreV1().Pods(ns.Name).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server must accept a launcher pod with spec.evictionResponders: %v", err)
	}
	if len(pod.Spec.EvictionResponders) != 1 {
		t.Fatalf("the API server dropped spec.evictionResponders: %+v", pod.Spec.EvictionResponders)
	}
	return v, pod
}

func dumpEvents(t *testing.T, ns string) {
	evs, err := cluster.Kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, e := range evs.Items {
		t.Logf("event %s/%s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
}

func waitEvent(t *testing.T, ns, object, reason string) *corev1.Event {
	t.Helper()
	return kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": object, "involvedObject.kind": "Eviction", "reason": reason}, 30*time.Second)
}

func waitVMI(t *testing.T, v *v1alpha1.VirtualMachineInstance, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	return kubewait.For(t, 30*time.Second, fmt.Sprintf("VMI %s: %s", v.Name, what), func(ctx context.Context) (*v1alpha1.VirtualMachineInstance, error) {
		return cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
	}, cond, func(v *v1alpha1.VirtualMachineInstance) string { return fmt.Sprintf("%+v", v.Status) })
}

func ownEntry(ev *lifecyclev1alpha1.Eviction) lifecyclev1alpha1.ResponderStatus {
	if e := Entry(ev); e != nil {
		return *e
	}
	return lifecyclev1alpha1.ResponderStatus{}
}

func messageContains(s string) func(*lifecyclev1alpha1.Eviction) bool {
	return func(ev *lifecyclev1alpha1.Eviction) bool { return strings.Contains(deref(ownEntry(ev).Message), s) }
}

// TestDeclinesAVMWithStrategyNone: the responder answers at once with completionTime and a reason,
// writes only its own entry, and the evictionrequest controller can move on to the imperative
// evictor: the API server accepts that step only because lifeboat completed properly.
func TestDeclinesAVMWithStrategyNone(t *testing.T) {
	metrics := startResponder(t)
	v, pod := runningVM(t, v1alpha1.EvictionStrategyNone)
	ctx := context.Background()
	erc, err := evictionrequest.Request(ctx, cluster.Kube, pod, "drain.example.com/admin")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := erc.Wait(ctx, 30*time.Second, "lifeboat's completionTime", func(ev *lifecyclev1alpha1.Eviction) bool { return ownEntry(ev).CompletionTime != nil })
	if err != nil {
		t.Fatal(err)
	}
	entry := ownEntry(ev)
	if msg := deref(entry.Message); !strings.Contains(msg, "eviction strategy None") {
		t.Errorf("message %q: want it to say the strategy None is why", msg)
	}
	if entry.HeartbeatTime == nil || entry.CompletionTime.Before(entry.StartTime) {
		t.Errorf("entry %+v: want a heartbeat and a completion after the start", entry)
	}
	for _, r := range ev.Status.Responders {
		if r.Name != v1alpha1.EvictionResponderName && (r.HeartbeatTime != nil || r.Message != nil || r.CompletionTime != nil) {
			t.Errorf("lifeboat must write only its own entry; %s has %+v", r.Name, r)
		}
	}
	owned := false
	for _, f := range ev.ManagedFields {
		owned = owned || (f.Manager == FieldManager && strings.Contains(f.FieldsV1.GetRawString(), v1alpha1.EvictionResponderName))
		if f.Manager == FieldManager && (f.Subresource != "status" || f.Operation != metav1.ManagedFieldsOperationApply ||
			strings.Contains(f.FieldsV1.GetRawString(), lifecyclev1alpha1.EvictionResponderImperativeEviction)) {
			t.Errorf("lifeboat's field manager must own only its entry, by apply on status: %s %s %s", f.Operation, f.Subresource, f.FieldsV1.GetRawString())
		}
	}
	if !owned {
		t.Errorf("field manager %s must own lifeboat's entry: %+v", FieldManager, ev.ManagedFields)
	}
	kubewait.Consistently(t, 2*time.Second, "a declined VM never marked", func(ctx context.Context) error {
		got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if err == nil && got.Status.EvacuationNodeName != "" {
			return fmt.Errorf("marked: %+v", got.Status)
		}
		return nil
	})
	waitEvent(t, v.Namespace, erc.Name, ReasonDeclined)
	if n := testutil.ToFloat64(metrics.Answered.WithLabelValues(OutcomeDeclined)); n != 1 {
		t.Errorf("evictions answered declined = %v, want 1", n)
	}
	next, err := erc.Advance(ctx)
	if err != nil || next != lifecyclev1alpha1.EvictionResponderImperativeEviction {
		t.Fatalf("after lifeboat declined, the imperative evictor must be able to take over: next %q, %v", next, err)
	}
}

// TestSecondRequesterJoinsAndWithdraws: a VM being evacuated for one requester stays so while a
// second joins and the first withdraws; the heartbeat names who still asks. When the last one
// withdraws, the Eviction is canceled and lifeboat clears the mark it set.
func TestSecondRequesterJoinsAndWithdraws(t *testing.T) {
	metrics := startResponder(t)
	v, pod := runningVM(t, v1alpha1.EvictionStrategyLiveMigrate)
	ctx := context.Background()
	const first, second = "drain.example.com/admin", "descheduler.example.com/balance"
	erc, err := evictionrequest.Request(ctx, cluster.Kube, pod, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := erc.Wait(ctx, 30*time.Second, "a heartbeat naming "+first, messageContains("requested by "+first)); err != nil {
		t.Fatal(err)
	}
	isMarked := func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
		return v.Status.EvacuationNodeName == node && c != nil && c.Status == metav1.ConditionTrue && c.Reason == string(v1alpha1.MigrationCauseEvictionRequest)
	}
	waitVMI(t, v, "marked for evacuation with cause EvictionRequest", isMarked)
	waitEvent(t, v.Namespace, erc.Name, ReasonEvacuating)
	// The evacuation's migration, as the evacuation controller makes it, not yet moving memory.
	pending, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: v.Name + "-evacuation", Labels: map[string]string{
			v1alpha1.LabelVMIName: v.Name, v1alpha1.LabelVMIUID: string(v.UID), v1alpha1.LabelEvacuation: "true"}},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: v.Name},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pending.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: string(v.UID)}
	if pending, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).UpdateStatus(ctx, pending, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := erc.Join(ctx, second); err != nil {
		t.Fatal(err)
	}
	if _, err := erc.Wait(ctx, 30*time.Second, "a heartbeat naming both requesters", messageContains("requested by "+first+", "+second)); err != nil {
		t.Fatal(err)
	}
	if err := erc.Withdraw(ctx, first); err != nil {
		t.Fatal(err)
	}
	ev, err := erc.Wait(ctx, 30*time.Second, "a heartbeat naming only "+second, messageContains("requested by "+second))
	if err != nil {
		t.Fatal(err)
	}
	if TargetState(ev) != lifecyclev1alpha1.ResponderStateActive || ownEntry(ev).CompletionTime != nil {
		t.Fatalf("one requester withdrawing leaves lifeboat at work: %+v", ev.Status)
	}
	kubewait.Consistently(t, 2*time.Second, "the mark kept while a requester remains", func(ctx context.Context) error {
		got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !isMarked(got) {
			return fmt.Errorf("the mark is gone: %+v", got.Status)
		}
		return nil
	})

	if err := erc.Withdraw(ctx, second); err != nil {
		t.Fatal(err)
	}
	got := waitVMI(t, v, "the mark cleared", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.EvacuationNodeName == "" })
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("EvictionRequested must turn False when the Eviction is canceled: %+v", got.Status.Conditions)
	}
	waitEvent(t, v.Namespace, erc.Name, ReasonCanceled)
	// Migration pending.Name had not started moving memory: the withdrawal must delete it, not
	// leave it to start and abort.
	kubewait.Gone(t, 10*time.Second, "migration "+pending.Name, func(ctx context.Context) error {
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).Get(ctx, pending.Name, metav1.GetOptions{})
		return err
	})
	if n := testutil.ToFloat64(metrics.Answered.WithLabelValues(OutcomeCanceled)); n != 1 {
		t.Errorf("evictions answered canceled = %v, want 1", n)
	}
	if n := testutil.CollectAndCount(metrics.WriteFailures); n != 0 {
		t.Errorf("the API server refused %d of lifeboat's writes", n)
	}
}
