package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// TestAnEvictedVMOutlivesItsTargetAgentsKill is the soak's seed 10 (soak-0): a VM evicted for
// node pressure, its migration capped, the target node's agent killed mid-migration (its proxy
// carried the guest's memory) and not back for the rest of the grace. The VM still leaves its
// node before the kubelet's deadline: the retry comes at once, not after a backoff, and its target
// goes to the one node whose agent is up, though the scheduler, left alone, prefers the node
// where the first attempt failed (it has more memory free).
func TestAnEvictedVMOutlivesItsTargetAgentsKill(t *testing.T) {
	// The soak's grace was 60 s, of which its source agent's kill took 14 s before any memory moved.
	const grace = 45
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("4Mi"))
		c.Spec.Migrations.AllowAutoConverge, c.Spec.Migrations.AllowPause = ptr.To(false), ptr.To(false)
	})
	startController(t)
	started := 0
	nodes := startNodes(t, 3, func(c *node.Config) {
		c.EvictionMaxPodGracePeriod = grace
		if started++; started == 3 {
			// The last node has the least memory: the scheduler places the VM and its first
			// target on the two others.
			c.Capacity[corev1.ResourceMemory] = resource.MustParse("1Gi")
		}
	})
	small := nodes[2]
	// 128 MiB, the soak's: at the cap a full copy takes 32 s, which the grace fits (the agents
	// see no VM at risk).
	vmi := createVMI(t, testNamespace(t), newVMI("target-agent-killed", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		// The pod's grace, this and a margin, is above the node's: the node's sets the deadline.
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
	}))
	vmi = waitVMI(t, vmi.Namespace, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)
	if source == small {
		t.Fatalf("the VM started on %s, the node with the least memory: the scheduler no longer prefers the others", small.Name())
	}
	watch := watchGuest(t, nodes, vmi)

	evicted := evict(t, source, vmi)
	marked := expectMarked(t, source, vmi)
	deadline := marked.Status.EvacuationDeadline.Time
	first := waitMigrationOf(t, vmi, "moving memory", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		p := m.Status.Progress
		return m.Status.Phase == v1alpha1.MigrationRunning && p != nil && p.DataRemaining > 0 && p.DataRemaining < p.DataTotal
	})
	var target *testNode
	for _, n := range nodes {
		if n.Name() == first.Status.TargetNode {
			target = n
		}
	}
	if target == nil || target == small {
		t.Fatalf("the first target went to %q, not the other node with more memory than %s: the scheduler no longer prefers it", first.Status.TargetNode, small.Name())
	}
	target.agent.Kill()
	t.Logf("killed the agent of %s, the target of %s, %s before the deadline", target.Name(), first.Name, time.Until(deadline).Round(100*time.Millisecond))
	defer target.agent.start(t)

	failed := waitMigrationOf(t, vmi, "Failed", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Name == first.Name && m.Status.Phase == v1alpha1.MigrationFailed
	})
	t.Logf("%s failed %s before the deadline: %s", failed.Name, deadline.Sub(failed.Status.EndTimestamp.Time).Round(100*time.Millisecond), failed.Status.FailureReason)
	moved := waitVMI(t, vmi.Namespace, vmi.Name, time.Until(deadline)+10*time.Second, "the VM moved off "+source.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != source.Name() || v.Status.Phase != v1alpha1.VMIRunning
	})
	if moved.UID != vmi.UID || moved.Status.Phase != v1alpha1.VMIRunning || moved.Status.NodeName != small.Name() ||
		moved.Status.MigrationState == nil || !moved.Status.MigrationState.Completed {
		t.Fatalf("want the VM running on %s, the node whose agent was up, migrated: %s", small.Name(), describe(moved))
	}
	if end := moved.Status.MigrationState.EndTimestamp; end == nil || end.After(deadline) {
		t.Errorf("the migration ended at %v, after the deadline %s", end, deadline.UTC().Format(time.RFC3339))
	} else {
		t.Logf("the retry %s moved the VM to %s %s before the deadline", moved.Status.MigrationState.MigrationName, small.Name(), deadline.Sub(end.Time).Round(100*time.Millisecond))
	}
	waitCounterPast(t, small.consolePath(moved), lastCounterOn(t, source.consolePath(vmi))+2, 30*time.Second)
	if err := evicted(); err != nil {
		t.Error(err)
	}
	watch.check(t)
}
