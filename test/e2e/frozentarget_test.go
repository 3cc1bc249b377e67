package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// The soak's defect 5 (seed 12): a VM evicted for node pressure two seconds after another node
// froze (every process stopped), still Ready in the API. Its first target pod is bound to the
// frozen node (the third node is cordoned until then, so that the scheduler has no other
// choice) and never starts. The migration gives that target up at half the time the deadline
// leaves, and the next target, kept off the frozen node, takes the guest before the deadline:
// the same instance counts on, on the third node.
func TestAFrozenTargetNodeIsPassedOverBeforeTheDeadline(t *testing.T) {
	const grace = 60
	setConfig(t, true)
	startController(t)
	nodes := startNodes(t, 3, func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("passed-over", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	var others []*testNode
	for _, n := range nodes {
		if n != source {
			others = append(others, n)
		}
	}
	frozen, spare := others[0], others[1]
	before := waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)

	cordon(t, spare.Name(), true)
	t.Cleanup(func() { cordon(t, spare.Name(), false) })
	freezeNode(t, frozen)
	evict(t, source, vmi)
	signalled := time.Now()
	first := waitMigrationOf(t, vmi, "with its target pod bound to the frozen node "+frozen.Name(), func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationScheduled && m.Status.TargetNode == frozen.Name()
	})
	cordon(t, spare.Name(), false)

	moved := waitVMI(t, ns, vmi.Name, grace*time.Second, "the VM moved to "+spare.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == spare.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	t.Logf("moved to %s %s after the eviction", spare.Name(), time.Since(signalled).Round(time.Millisecond))
	if moved.UID != vmi.UID {
		t.Errorf("the VM's instance is %s, want %s: it must have moved, not restarted", moved.UID, vmi.UID)
	}
	waitCounterPast(t, spare.consolePath(moved), before+2, 30*time.Second)

	gaveUp, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Get(context.Background(), first.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gaveUp.Status.Phase != v1alpha1.MigrationFailed || !strings.Contains(gaveUp.Status.FailureReason, "the target was not ready") {
		t.Errorf("the first migration is %s (%q); want Failed for its target not ready in time", gaveUp.Status.Phase, gaveUp.Status.FailureReason)
	} else {
		t.Logf("the first migration: %s", gaveUp.Status.FailureReason)
	}
	e := waitEvent(t, ns, vmi.Name, migration.ReasonTargetNotReadyInTime, 10*time.Second)
	t.Logf("%s: %s", e.Reason, e.Message)
}
