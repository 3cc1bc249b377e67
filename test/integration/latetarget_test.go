package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// TestATargetThatNeverStartsIsReplacedBeforeTheDeadline is the soak's defect 5 through the real
// API server and scheduler: a VM evicted for node pressure (45 s of grace) while one of the two
// other nodes is frozen, still Ready in the API. The scheduler binds the first target pod to
// one of them, and the test plays that node frozen: its kubelet never starts the pod. The
// migration gives the target up once it has had half the time the deadline leaves (not at the
// deadline, where the guest would be lost), saying so on the migration and the VMI; the next
// migration's target keeps off that node, lands on the other, and is ready before the deadline.
func TestATargetThatNeverStartsIsReplacedBeforeTheDeadline(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "late-")
	startVMControllers(t)
	source := startFakeNode(t, "late-source")
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate),
			Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/guest-kernel:1", KernelPath: "/boot/vmlinuz"}, Cmdline: "console=ttyS0"}}}
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, v, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningVMI(t, ns, v.Name)
	targets := []string{startFakeNode(t, "late-a").name, startFakeNode(t, "late-b").name}
	startEvacuationControllers(t)

	// The agent marks the VM for node pressure, as the kubelet's SIGTERM with 45 s of grace asks.
	deadline := metav1.NewTime(time.Now().Add(45 * time.Second).Truncate(time.Second))
	updateVMIStatus(t, ns, v.Name, func(v *v1alpha1.VirtualMachineInstance) {
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})
		v.Status.EvacuationNodeName, v.Status.EvacuationDeadline = v.Status.NodeName, &deadline
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue,
			Reason: string(v1alpha1.MigrationCauseNodePressure), Message: "the kubelet is evicting the launcher pod"})
	})

	first := waitMigrationOf(t, ns, v.Name, "with its target pod bound to a node", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationScheduled
	})
	frozen := first.Status.TargetNode
	if first.Status.SourceNode != source.name || !slices.Contains(targets, frozen) {
		t.Fatalf("the first migration goes from %q to %q; want from %s to one of %v", first.Status.SourceNode, frozen, source.name, targets)
	}
	other := targets[0]
	if other == frozen {
		other = targets[1]
	}

	// Node frozen: the target pod stays Pending. The migration gives it up well before the deadline.
	migrations := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	failed := kubewait.For(t, 40*time.Second, "the first migration Failed for its target not ready in time", func(ctx context.Context) (*v1alpha1.VirtualMachineInstanceMigration, error) {
		return migrations.Get(ctx, first.Name, metav1.GetOptions{})
	}, func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationFailed
	}, func(m *v1alpha1.VirtualMachineInstanceMigration) string {
		return fmt.Sprintf("%s: %s", m.Status.Phase, m.Status.FailureReason)
	})
	if r := failed.Status.FailureReason; !strings.Contains(r, "the target was not ready") || !strings.Contains(r, "is Pending on node "+frozen) {
		t.Errorf("the first migration failed with %q; want it to say its target was not ready, Pending on %s", r, frozen)
	}
	if left := deadline.Sub(failed.Status.EndTimestamp.Time); left < 15*time.Second {
		t.Errorf("the first target was given up %s before the deadline; want time left for another (at least 15s)", left)
	}
	// No kubelet on a frozen node finishes a deletion: being deleted is what lifeboat can do.
	kubewait.For(t, 30*time.Second, "the given-up target pod "+failed.Status.TargetPod+" being deleted", func(ctx context.Context) (string, error) {
		p, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, failed.Status.TargetPod, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return "gone", nil
		case err != nil:
			return "", err
		case p.DeletionTimestamp != nil:
			return "being deleted", nil
		}
		return string(p.Status.Phase), nil
	}, func(s string) bool { return s == "gone" || s == "being deleted" }, nil)
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": first.Name, "reason": migration.ReasonTargetNotReadyInTime}, 10*time.Second)
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": v.Name, "reason": migration.ReasonTargetNotReadyInTime}, 10*time.Second)

	// The next migration's target keeps off the frozen node and is ready before the deadline.
	second := kubewait.For(t, 30*time.Second, "a second migration with its target bound to a node", func(ctx context.Context) (*v1alpha1.VirtualMachineInstanceMigration, error) {
		list, err := migrations.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			if m := &list.Items[i]; m.Name != first.Name && m.Spec.VMIName == v.Name {
				return m, nil
			}
		}
		return nil, nil
	}, func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m != nil && m.Status.Phase == v1alpha1.MigrationScheduled
	}, func(m *v1alpha1.VirtualMachineInstanceMigration) string {
		if m == nil {
			return "none"
		}
		return fmt.Sprintf("%s %s on %q", m.Name, m.Status.Phase, m.Status.TargetNode)
	})
	if second.Status.TargetNode != other {
		t.Fatalf("the second target is on %q; want %s, not the frozen %s", second.Status.TargetNode, other, frozen)
	}
	ready := prepareTarget(t, second, other)
	if !ready.Status.PhaseTransitionTimestamps[len(ready.Status.PhaseTransitionTimestamps)-1].Timestamp.Before(&deadline) {
		t.Errorf("the second target was ready after the deadline %s: %+v", deadline, ready.Status.PhaseTransitionTimestamps)
	}
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": second.Name, "reason": migration.ReasonTargetAvoidsNodes}, 10*time.Second)
}

// TestATargetKeepsOffANodeWhoseLeaseStopped: of two nodes that could take a drained VM's
// target, the one the scheduler prefers (all its memory free) has stopped renewing its Lease,
// as a frozen node's kubelet does long before the node lifecycle controller counts it out. The
// target pod keeps off it, says so, and goes to the other.
func TestATargetKeepsOffANodeWhoseLeaseStopped(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "lease-")
	startVMControllers(t)
	startFakeNode(t, "lease-source")
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate),
			Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/guest-kernel:1", KernelPath: "/boot/vmlinuz"}, Cmdline: "console=ttyS0"}}}
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, v, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningVMI(t, ns, v.Name)
	frozen, live := startFakeNode(t, "lease-frozen"), startFakeNode(t, "lease-live")
	// The live node has less memory: the scheduler, left alone, prefers the frozen one.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Kube.CoreV1().Nodes().Get(ctx, live.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Capacity[corev1.ResourceMemory], n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("2Gi"), resource.MustParse("2Gi")
		_, err = cluster.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Frozen 30 s ago: its last renewal then, the others' every 5 s since.
	frozen.stopLease()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := cluster.Kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, frozen.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-30 * time.Second)}
		_, err = cluster.Kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	startEvacuationControllers(t)

	updateVMIStatus(t, ns, v.Name, func(v *v1alpha1.VirtualMachineInstance) {
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})
		v.Status.EvacuationNodeName = v.Status.NodeName
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue,
			Reason: string(v1alpha1.MigrationCauseDrain), Message: "drained"})
	})
	m := waitMigrationOf(t, ns, v.Name, "with its target pod bound to a node", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationScheduled
	})
	if m.Status.TargetNode != live.name {
		t.Errorf("the target is on %q; want %s, not %s, whose Lease stopped", m.Status.TargetNode, live.name, frozen.name)
	}
	e := kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": m.Name, "reason": migration.ReasonTargetAvoidsNodes}, 10*time.Second)
	if !strings.Contains(e.Message, frozen.name+", whose kubelet stopped renewing its Lease") {
		t.Errorf("the %s Event says %q; want it to name %s and its Lease", migration.ReasonTargetAvoidsNodes, e.Message, frozen.name)
	}
}
