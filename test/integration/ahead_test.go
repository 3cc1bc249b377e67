package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/cancellation"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// startEvacuationControllers runs the evacuation, migration, disruption-budget and cancellation
// controllers until the test ends, as lifeboat-controller runs them.
func startEvacuationControllers(t *testing.T) {
	t.Helper()
	p := newInProcess(t)
	lbv1 := p.lb.Lifeboat().V1alpha1()
	nodes, boundPods := evacuate.NewCapacityInformers(cluster.Kube)
	budgets := disruption.NewBudgetInformer(cluster.Kube)
	leases := migration.NewLeaseInformer(cluster.Kube)
	evacuations := evacuate.New(cluster.Lifeboat, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(), nodes, boundPods, p.recorder, p.log)
	migrations := migration.New(cluster.Kube, cluster.Lifeboat, lbv1.VirtualMachineInstanceMigrations(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(),
		p.launchers.Core().V1().Pods(), budgets, nodes, leases, p.recorder, vmi.PodOptions{Image: "lifeboat-launcher:test", Acceleration: "tcg"}, prometheus.NewRegistry(), p.log)
	budgetsController := disruption.New(cluster.Kube, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(),
		p.launchers.Core().V1().Pods(), budgets, p.recorder, p.log)
	cancels := cancellation.New(cluster.Lifeboat, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), p.recorder,
		cancellation.NewMetrics(prometheus.NewRegistry()), p.log)
	for _, inf := range []interface{ RunWithContext(context.Context) }{nodes, boundPods, budgets, leases} {
		go inf.RunWithContext(p.ctx)
	}
	p.run(t, evacuations.Run, func(ctx context.Context) error { return migrations.Run(ctx, 2) },
		cancels.Run, func(ctx context.Context) error { return budgetsController.Run(ctx, 1) })
}

// inProcess is what lifeboat-controller's controllers share when a test runs them in its own
// process against the real control plane: a context that ends with the test, an Event recorder
// writing to the API server, a log, and the informer factories of launcher pods and of lifeboat's
// objects.
type inProcess struct {
	ctx         context.Context
	cancel      context.CancelFunc
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	log         *slog.Logger
	launchers   informers.SharedInformerFactory
	lb          lifeboatinformers.SharedInformerFactory
}

func newInProcess(t *testing.T) *inProcess {
	t.Helper()
	if err := v1alpha1.AddToScheme(scheme.Scheme); err != nil {
		t.Fatal(err)
	}
	p := &inProcess{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.broadcaster = record.NewBroadcaster(record.WithContext(p.ctx))
	p.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cluster.Kube.CoreV1().Events("")})
	p.recorder = p.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lifeboat-controller"})
	p.launchers = informers.NewSharedInformerFactoryWithOptions(cluster.Kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	p.lb = lifeboatinformers.NewSharedInformerFactory(cluster.Lifeboat, 0)
	return p
}

// run starts the factories and each of runs until the test ends, when it stops them and waits.
func (p *inProcess) run(t *testing.T, runs ...func(context.Context) error) {
	p.launchers.Start(p.ctx.Done())
	p.lb.Start(p.ctx.Done())
	done := make(chan struct{}, len(runs))
	for _, run := range runs {
		go func() {
			defer func() { done <- struct{}{} }()
			if err := run(p.ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(func() {
		p.cancel()
		for range runs {
			<-done
		}
		p.broadcaster.Shutdown()
	})
}

// setParallelLimits writes the cluster's parallel-migration limits, and puts back what was there
// when the test ends.
func setParallelLimits(t *testing.T, perCluster, perNode int32) {
	t.Helper()
	ctx := context.Background()
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	old, err := configs.Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		old = nil
		_, err = configs.Create(ctx, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := configs.Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Spec.Migrations.ParallelMigrationsPerCluster, c.Spec.Migrations.ParallelOutboundMigrationsPerNode = ptr.To(perCluster), ptr.To(perNode)
		_, err = configs.Update(ctx, c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if old == nil {
			_ = configs.Delete(context.Background(), v1alpha1.ConfigName, metav1.DeleteOptions{})
			return
		}
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := configs.Get(context.Background(), v1alpha1.ConfigName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			c.Spec.Migrations = old.Spec.Migrations
			_, err = configs.Update(context.Background(), c, metav1.UpdateOptions{})
			return err
		})
	})
}

// TestAMigrationMadeAheadWaitsForItsSlot is issue 48's prepare-ahead through the real API server
// and lifeboat's evacuation, migration and cancellation controllers, the test playing the nodes'
// agents and kubelets. Three VMs marked for a drain from a node whose limit is one: one migration
// moves memory; once its target is ready a second is made ahead, prepares its target and waits
// at TargetReady, saying so, until the first ends; then it gets the slot and a third is made
// ahead. While the first moves memory, the second follows it (status.evacuation.slotAfterUID).
// The third, cancelled while it waits, goes with its target pod and leaves its VM as it was.
func TestAMigrationMadeAheadWaitsForItsSlot(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("ahead-%d", time.Now().UnixNano())
	if _, err := cluster.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	setParallelLimits(t, 5, 1)
	startVMControllers(t)
	source := startFakeNode(t, "ahead-source")
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	names := []string{"vm-a", "vm-b", "vm-c"}
	for _, name := range names {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate),
				Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/guest-kernel:1", KernelPath: "/boot/vmlinuz"}, Cmdline: "console=ttyS0"}}}
		if _, err := vmis.Create(ctx, v, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		runningVMI(t, ns, name)
	}
	target := startFakeNode(t, "ahead-target")
	startEvacuationControllers(t)
	// Each VM live-migratable (as its agent reports) and marked for a drain (as the webhook marks).
	for _, name := range names {
		updateVMIStatus(t, ns, name, func(v *v1alpha1.VirtualMachineInstance) {
			meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})
			v.Status.EvacuationNodeName = v.Status.NodeName
			meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue,
				Reason: string(v1alpha1.MigrationCauseDrain), Message: "drained"})
		})
	}

	a := waitMigrationOf(t, ns, "vm-a", "created with the node's one slot", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.EvacuatedVMI() != ""
	})
	if a.WaitingForSlot() {
		t.Errorf("the first migration waits for a slot; want it to have the free one")
	}
	onlyMigrations(t, ns, time.Second, "none made ahead while the first's target is not ready", "vm-a")
	a = prepareTarget(t, a, target.name)

	b := waitMigrationOf(t, ns, "vm-b", "made ahead once the first's target is ready", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.WaitingForSlot()
	})
	b = prepareTarget(t, b, target.name)
	kubewait.Consistently(t, time.Second, "the migration made ahead waits at TargetReady while the slot is taken", func(ctx context.Context) error {
		m, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Get(ctx, b.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !m.WaitingForSlot() || m.Status.Phase != v1alpha1.MigrationTargetReady {
			return fmt.Errorf("phase %s, waiting for a slot %v", m.Status.Phase, m.WaitingForSlot())
		}
		return nil
	})
	onlyMigrations(t, ns, 0, "one made ahead for the node's one slot", "vm-a", "vm-b")

	// The first moves memory: the one made ahead, its target ready, follows it (its source agent
	// starts it the moment the first's transfer ends) and still waits for the slot.
	now := metav1.Now()
	a = updateMigrationStatus(t, a, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		x.Status.Phase, x.Status.StartTimestamp, x.Status.Mode = v1alpha1.MigrationRunning, &now, v1alpha1.MigrationModePreCopy
	})
	b = waitMigrationOf(t, ns, "vm-b", "following the first, under way", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.SlotAfter() == string(a.UID)
	})
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": b.Name, "reason": evacuate.ReasonFollows}, 10*time.Second)

	// The first migration ends as its source agent ends it: the VM runs on the target.
	succeed(t, a, target.name)
	waitMigrationOf(t, ns, "vm-b", "given the freed slot", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Evacuation != nil && !m.WaitingForSlot()
	})
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": b.Name, "reason": evacuate.ReasonSlotGranted}, 10*time.Second)
	c := waitMigrationOf(t, ns, "vm-c", "made ahead once the second has the slot and its target is ready", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.WaitingForSlot()
	})
	c = prepareTarget(t, c, target.name)

	// Cancelled while it waits: the migration and its target pod go, and the VM is as it was.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := vmis.Get(ctx, "vm-c", metav1.GetOptions{})
		if err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&v.ObjectMeta, v1alpha1.AnnotationCancelEvacuation, "true")
		_, err = vmis.Update(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Get(ctx, c.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			last = fmt.Errorf("migration %s is still there (%v)", c.Name, err)
			return false, nil
		}
		pod, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, c.Status.TargetPod, metav1.GetOptions{})
		if err == nil && pod.DeletionTimestamp == nil {
			last = fmt.Errorf("its target pod %s is not being deleted", pod.Name)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("want the cancelled migration made ahead gone with its target pod within 30s: %v", last)
	}
	v, err := vmis.Get(ctx, "vm-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Status.NodeName != source.name || v.Status.MigrationState != nil || v.Status.Phase != v1alpha1.VMIRunning || v.Status.EvacuationNodeName != "" {
		t.Errorf("the cancelled VM is on %q, %s, migration state %+v, mark %q; want it Running on %s, never migrated, unmarked",
			v.Status.NodeName, v.Status.Phase, v.Status.MigrationState, v.Status.EvacuationNodeName, source.name)
	}
}

// updateVMIStatus changes a VMI's status as its agent would.
func updateVMIStatus(t *testing.T, ns, name string, change func(*v1alpha1.VirtualMachineInstance)) {
	t.Helper()
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := vmis.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(v)
		_, err = vmis.UpdateStatus(context.Background(), v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// updateMigrationStatus changes a migration's status as an agent would.
func updateMigrationStatus(t *testing.T, m *v1alpha1.VirtualMachineInstanceMigration, change func(*v1alpha1.VirtualMachineInstanceMigration)) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	client := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(m.Namespace)
	var out *v1alpha1.VirtualMachineInstanceMigration
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := client.Get(context.Background(), m.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(cur)
		out, err = client.UpdateStatus(context.Background(), cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitMigrationOf waits for a migration of the VMI to satisfy ok and returns it (a VMI whose
// first migration failed has a second).
func waitMigrationOf(t *testing.T, ns, vmiName, what string, ok func(*v1alpha1.VirtualMachineInstanceMigration) bool) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	var found *v1alpha1.VirtualMachineInstanceMigration
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range list.Items {
			if m := &list.Items[i]; m.Spec.VMIName == vmiName {
				if found = m; ok(m) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		if found == nil {
			t.Fatalf("want the migration of %s %s within 30s; there is none", vmiName, what)
		}
		t.Fatalf("want the migration of %s %s within 30s; it is %s with %+v", vmiName, what, found.Status.Phase, found.Status.Evacuation)
	}
	return found
}

// onlyMigrations checks, over window (once if 0), that the namespace's migrations are those of
// vmiNames.
func onlyMigrations(t *testing.T, ns string, window time.Duration, what string, vmiNames ...string) {
	t.Helper()
	check := func(ctx context.Context) error {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var got []string
		for _, m := range list.Items {
			got = append(got, m.Spec.VMIName)
		}
		if fmt.Sprint(got) != fmt.Sprint(vmiNames) {
			return fmt.Errorf("migrations of %v, want of %v", got, vmiNames)
		}
		return nil
	}
	if window == 0 {
		if err := check(context.Background()); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		return
	}
	kubewait.Consistently(t, window, what, check)
}

// prepareTarget plays the target node: its kubelet runs the migration's target pod, and once
// the migration controller hands the migration over (PreparingTarget), its agent announces the
// target ready.
func prepareTarget(t *testing.T, m *v1alpha1.VirtualMachineInstanceMigration, node string) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	m = waitMigrationOf(t, m.Namespace, m.Spec.VMIName, "with its target pod scheduled to "+node, func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Status.Phase == v1alpha1.MigrationScheduled && x.Status.TargetNode == node
	})
	pods := cluster.Kube.CoreV1().Pods(m.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := pods.Get(context.Background(), m.Status.TargetPod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		_, err = pods.UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	m = waitMigrationOf(t, m.Namespace, m.Spec.VMIName, "handed to the target agent", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Status.Phase == v1alpha1.MigrationPreparingTarget
	})
	return updateMigrationStatus(t, m, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		x.Status.Phase = v1alpha1.MigrationTargetReady
		x.Status.PhaseTransitionTimestamps = append(x.Status.PhaseTransitionTimestamps, v1alpha1.MigrationPhaseTransition{Phase: v1alpha1.MigrationTargetReady, Timestamp: metav1.Now()})
		x.Status.TargetProxy = &v1alpha1.MigrationProxy{Libvirt: "127.0.0.1:1", Memory: "127.0.0.1:2", Disks: "127.0.0.1:3"}
	})
}

// succeed plays the source agent through a migration that moves the VM to node: Running, the
// VMI on the target with its mark cleared, Succeeded.
func succeed(t *testing.T, m *v1alpha1.VirtualMachineInstanceMigration, node string) {
	t.Helper()
	now := metav1.Now()
	m = updateMigrationStatus(t, m, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		x.Status.Phase, x.Status.StartTimestamp, x.Status.Mode = v1alpha1.MigrationRunning, &now, v1alpha1.MigrationModePreCopy
	})
	updateVMIStatus(t, m.Namespace, m.Spec.VMIName, func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: m.Name, MigrationUID: string(m.UID),
			SourceNode: v.Status.NodeName, TargetNode: node, StartTimestamp: &now, EndTimestamp: &now, Completed: true, TargetNodeDomainReadyTimestamp: &now}
		v.Status.NodeName, v.Status.EvacuationNodeName = node, ""
		meta.RemoveStatusCondition(&v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
	})
	updateMigrationStatus(t, m, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		x.Status.Phase, x.Status.EndTimestamp = v1alpha1.MigrationSucceeded, &now
	})
}
