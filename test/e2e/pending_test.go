package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// A drain of a node with two VMs and one outbound slot: the first VM's target can never be
// scheduled (its node selector matches only the node it leaves). Its migration fails after the
// configured pending timeout with the scheduler's own words, and frees the slot, so the second VM
// still moves; the first keeps running where it was. lifeboat then stops trying it while nothing
// changes that could place it, and tries again, successfully, once a node gets the label.
func TestATargetThatCannotBeScheduledFreesItsSlot(t *testing.T) {
	setConfig(t, false, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.UnschedulablePendingTimeoutSeconds = ptr.To[int64](5)
		c.Spec.Migrations.ParallelOutboundMigrationsPerNode = ptr.To[int32](1)
	})
	startController(t)
	const pin = "e2e.lifeboat.dev/pinned"
	source := startNodes(t, 1, func(c *node.Config) { c.Labels = map[string]string{pin: "yes"} })[0]
	ns := testNamespace(t)
	live := strategy(v1alpha1.EvictionStrategyLiveMigrate)
	stuck := createVMI(t, ns, newVMI("stuck", live, func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{pin: "yes"} }))
	mover := createVMI(t, ns, newVMI("mover", live))
	for _, v := range []*v1alpha1.VirtualMachineInstance{stuck, mover} {
		v = waitVMI(t, ns, v.Name, bootTimeout, "phase Running", running)
		waitCounterPast(t, source.consolePath(v), 0, bootTimeout)
	}
	startNodes(t, 1) // the only place to go, without the label
	// A node with the label that nothing reaches: placement counts it, so the VM is migratable and
	// gets a migration whose target the scheduler cannot place (without it, NoTargetNode: no
	// migration at all, TestADrainOfPinnedVMsSaysSoAtOnce).
	phantomNode(t, map[string]string{pin: "yes"})

	stuck = waitVMI(t, ns, stuck.Name, time.Second, "running", running)
	order := watchBudgetAndTarget(t, stuck)
	setMark(t, stuck, true)
	first := waitMigrationOf(t, stuck, "with its target pod waiting for a node", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationScheduling
	})
	// Seed 000: the budget covers the target pod before that pod exists, so no eviction can take
	// the source in between. etcd orders every write, and resource versions are its revisions.
	var budgetGrew, targetCreated int64
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		budgetGrew, targetCreated = order()
		return budgetGrew != 0 && targetCreated != 0, nil
	})
	if budgetGrew == 0 || targetCreated == 0 || budgetGrew > targetCreated {
		t.Errorf("the budget grew to 2 at revision %d, the target pod was created at revision %d; want the budget first", budgetGrew, targetCreated)
	}
	moverPod := launcherPod(t, mover)
	setMark(t, waitVMI(t, ns, mover.Name, time.Second, "running", running), true)

	failed := waitMigrationOf(t, stuck, "Failed", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Name == first.Name && m.Status.Phase == v1alpha1.MigrationFailed
	})
	if r := failed.Status.FailureReason; !strings.Contains(r, "node affinity/selector") || !strings.Contains(r, "limit is 5s") {
		t.Errorf("the stuck migration failed with %q; want the scheduler's reason and the 5s limit", r)
	}
	if waited := failed.Status.EndTimestamp.Sub(failed.CreationTimestamp.Time); waited > 30*time.Second {
		t.Errorf("the stuck migration held its slot for %s; the limit was 5s", waited)
	}
	moved := waitVMI(t, ns, mover.Name, 2*time.Minute, "running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName != source.Name() && v.Status.NodeName != ""
	})
	if s := moved.Status.MigrationState; s == nil || !s.Completed {
		t.Errorf("the second VM should have moved by a completed migration: %s", describe(moved))
	}
	if v := waitVMI(t, ns, stuck.Name, time.Second, "running", running); v.Status.NodeName != source.Name() {
		t.Errorf("the VM whose target could not be placed should still run on %s: %s", source.Name(), describe(v))
	}

	// The second VM's old pod ended after the first failure, which could have made room: lifeboat
	// may try again. Once a failure ends after that, the VM waits for capacity, and says so.
	last, tries := waitAwaitingCapacity(t, stuck, waitPodEnded(t, moverPod))
	// Past the backoff after that many failures (5 s doubling), a retry would have shown.
	window := 5*time.Second<<(tries-1) + 5*time.Second
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, window, true, func(context.Context) (bool, error) {
		return len(migrationsOf(t, stuck)) != tries, nil
	})
	if err == nil {
		t.Fatalf("lifeboat tried again although nothing changed since migration %s found no node: %v", last, migrationsOf(t, stuck))
	}
	target := waitVMI(t, ns, mover.Name, time.Second, "running", running).Status.NodeName
	labelNode(t, target, pin, "yes")
	moved = waitVMI(t, ns, stuck.Name, 2*time.Minute, "running on node "+target+" once it has the label", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName == target
	})
	if s := moved.Status.MigrationState; s == nil || !s.Completed {
		t.Errorf("the VM should have moved by a completed migration: %s", describe(moved))
	}
}

// migrationsOf lists v's migrations as name:phase.
func migrationsOf(t *testing.T, v *v1alpha1.VirtualMachineInstance) []string {
	t.Helper()
	list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range list.Items {
		out = append(out, m.Name+":"+string(m.Status.Phase))
	}
	return out
}

// waitPodEnded waits until pod is terminal or gone, and returns when it saw that.
func waitPodEnded(t *testing.T, pod *corev1.Pod) time.Time {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed), nil
	})
	if err != nil {
		t.Fatalf("pod %s did not end within a minute", pod.Name)
	}
	return time.Now()
}

// waitAwaitingCapacity waits until every migration of v has failed, the newest one, which no
// node took, ended after after (whole seconds, as the API keeps times), and an
// EvacuationAwaitingCapacity Event on v names it; it returns that migration's name and how many
// migrations v had.
func waitAwaitingCapacity(t *testing.T, v *v1alpha1.VirtualMachineInstance, after time.Time) (string, int) {
	t.Helper()
	ctx := context.Background()
	var last, seen string
	var tries int
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).List(ctx,
			metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
		if err != nil {
			return false, nil
		}
		var newest *v1alpha1.VirtualMachineInstanceMigration
		for i := range list.Items {
			m := &list.Items[i]
			if m.Status.Phase != v1alpha1.MigrationFailed {
				return false, nil
			}
			if newest == nil || m.Status.EndTimestamp.After(newest.Status.EndTimestamp.Time) {
				newest = m
			}
		}
		if newest == nil || !newest.Status.TargetUnschedulable || !newest.Status.EndTimestamp.After(after) {
			return false, nil
		}
		last = newest.Name
		events, err := cluster.Kube.CoreV1().Events(v.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": v.Name, "reason": evacuate.ReasonAwaitingCapacity}.String()})
		if err != nil {
			return false, nil
		}
		for _, e := range events.Items {
			seen = e.Message
			if strings.Contains(e.Message, "migration "+last+" ") {
				tries = len(list.Items)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("want every migration of %s failed, the newest (%s) for want of a node after %s, and an %s Event naming it; seen %v and the Event %q",
			v.Name, last, after.UTC().Format(time.RFC3339), evacuate.ReasonAwaitingCapacity, migrationsOf(t, v), seen)
	}
	return last, tries
}

// labelNode sets a label on a node, as an admin would.
func labelNode(t *testing.T, node, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := cluster.Kube.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// watchBudgetAndTarget watches v's disruption budget and launcher pods from now; the function it
// returns gives the revision at which the budget first kept 2 pods and the one at which a second
// launcher pod (a migration's target) was created, 0 for what was not seen.
func watchBudgetAndTarget(t *testing.T, v *v1alpha1.VirtualMachineInstance) func() (budgetGrew, targetCreated int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sel := metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)}
	pods, err := cluster.Kube.CoreV1().Pods(v.Namespace).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	budgets, err := cluster.Kube.PolicyV1().PodDisruptionBudgets(v.Namespace).Watch(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	podSel := sel
	podSel.ResourceVersion = pods.ResourceVersion
	podWatch, err := cluster.Kube.CoreV1().Pods(v.Namespace).Watch(ctx, podSel)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var grew, created int64
	go func() {
		for ev := range budgets.ResultChan() {
			if b, ok := ev.Object.(*policyv1.PodDisruptionBudget); ok && b.Spec.MinAvailable != nil && b.Spec.MinAvailable.IntValue() >= 2 {
				mu.Lock()
				if grew == 0 {
					grew, _ = strconv.ParseInt(b.ResourceVersion, 10, 64)
				}
				mu.Unlock()
			}
		}
	}()
	go func() {
		for ev := range podWatch.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				mu.Lock()
				if created == 0 {
					created, _ = strconv.ParseInt(p.ResourceVersion, 10, 64)
				}
				mu.Unlock()
			}
		}
	}()
	return func() (int64, int64) {
		mu.Lock()
		defer mu.Unlock()
		return grew, created
	}
}
