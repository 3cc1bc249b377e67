package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/test/evictionrequest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// An EvictionRequest for a VM that no node can take (its node selector matches only the node it
// leaves): once the migration fails for want of a node, lifeboat stops heartbeating for nothing.
// It completes with a message that says why, so the Eviction goes on to the next responder; the
// VM runs on where it was, still marked, to leave when a node can take it.
func TestAnEvictionRequestNoNodeCanServeIsGivenUp(t *testing.T) {
	setConfig(t, false, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.UnschedulablePendingTimeoutSeconds = ptr.To[int64](5)
	})
	startController(t)
	const pin = "e2e.lifeboat.dev/pinned"
	source := startNodes(t, 1, func(c *node.Config) { c.Labels = map[string]string{pin: "yes"} })[0]
	startNodes(t, 1)
	// A node with the label that nothing reaches: the VM counts as migratable, so lifeboat takes
	// the EvictionRequest on and its migration finds no node the scheduler can use (without it,
	// NoTargetNode: lifeboat declines at once).
	phantomNode(t, map[string]string{pin: "yes"})
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("nowhere", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.NodeSelector = map[string]string{pin: "yes"}
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	before := waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)

	ctx := context.Background()
	erc, err := evictionrequest.Request(ctx, cluster.Kube, launcherPod(t, vmi), requester)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := erc.Wait(ctx, time.Minute, "lifeboat's completionTime", func(ev *lifecyclev1alpha1.Eviction) bool { return responder.Entry(ev).CompletionTime != nil })
	if err != nil {
		t.Fatal(err)
	}
	msg := ptr.Deref(responder.Entry(ev).Message, "")
	if !strings.Contains(msg, "no node takes VM "+ns+"/nowhere") || !strings.Contains(msg, "node affinity/selector") {
		t.Errorf("completion message %q: want it to say no node takes the VM, in the scheduler's words", msg)
	}
	waitEvent(t, ns, erc.Name, responder.ReasonStalled, 10*time.Second)
	if next, err := erc.Advance(ctx); err != nil || next != lifecyclev1alpha1.EvictionResponderImperativeEviction {
		t.Fatalf("after lifeboat gave up, the Eviction must go on to the imperative evictor: next %q, %v", next, err)
	}
	v := waitVMI(t, ns, vmi.Name, time.Second, "running", running)
	if v.Status.NodeName != source.Name() || !marked(v) {
		t.Errorf("the VM runs on where it was, still marked: %s", describe(v))
	}
	waitCounterPast(t, source.consolePath(vmi), before+2, 30*time.Second)
}

// While lifeboat migrates a VM for an EvictionRequest, a person deletes the VM's pod (60 s of
// grace): the agent re-marks the VM for the pod's deletion, with the pod's deadline, and the
// running migration, which had none, takes that deadline on; the evictionrequest controller
// interrupts lifeboat's turn (the Eviction's target was deleted). lifeboat stops answering and
// says the evacuation goes on for the deletion, and the VM leaves in time.
func TestAnInterruptedEvictionRequestLeavesTheVMToThePodDeletion(t *testing.T) {
	const grace = 60
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		// Pre-copy alone does not converge: the guest dirties as fast as the cap sends.
		c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("16Mi"))
	})
	startController(t)
	nodes := startNodes(t, 2)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("interrupted", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Memory = resource.MustParse("256Mi")
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
		v.Spec.Boot.Cmdline += " " + protocol.DirtyParam + "=64M " + protocol.DirtyRateParam + "=16M"
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)

	ctx := context.Background()
	pod := launcherPod(t, vmi)
	erc, err := evictionrequest.Request(ctx, cluster.Kube, pod, requester)
	if err != nil {
		t.Fatal(err)
	}
	m := waitRunningMigration(t, ns, "the EvictionRequest")
	if m.Status.Deadline != nil {
		t.Fatalf("an EvictionRequest's migration has no deadline: %s", m.Status.Deadline)
	}
	if err := cluster.Kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](grace)}); err != nil {
		t.Fatal(err)
	}
	deleting, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || deleting.DeletionTimestamp == nil {
		t.Fatalf("the deleted pod %s: %v", pod.Name, err)
	}
	tightened := waitMigrationOf(t, vmi, "with the pod's deadline", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Name == m.Name && x.Status.Deadline != nil
	})
	if d := tightened.Status.Deadline; d.Sub(deleting.DeletionTimestamp.Time).Abs() > time.Second {
		t.Errorf("the running migration's deadline is %s, want the pod's deletionTimestamp %s", d, deleting.DeletionTimestamp)
	}
	waitEvent(t, ns, m.Name, "DeadlineTightened", 10*time.Second)

	if err := erc.TargetDeleted(ctx); err != nil {
		t.Fatal(err)
	}
	e := waitEvent(t, ns, erc.Name, responder.ReasonInterrupted, 10*time.Second)
	if !strings.Contains(e.Message, "marked for another cause (PodDeleted)") {
		t.Errorf("the %s Event says %q; want it to say the pod deletion's evacuation goes on", responder.ReasonInterrupted, e.Message)
	}
	moved := waitVMI(t, ns, vmi.Name, grace*time.Second, "running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName != "" && v.Status.NodeName != source.Name()
	})
	if s := moved.Status.MigrationState; s == nil || !s.Completed || s.MigrationName != m.Name {
		t.Errorf("the VM should have moved by the migration that was running: %s", describe(moved))
	}
	// The target's launcher report or, if the source recorded the outcome first, the target
	// agent's look at the guest.
	waitVMI(t, ns, vmi.Name, 10*time.Second, "the target node's record of when the guest ran there (migrationState.targetNodeDomainReadyTimestamp)",
		func(v *v1alpha1.VirtualMachineInstance) bool {
			s := v.Status.MigrationState
			return s != nil && s.MigrationName == m.Name && s.TargetNodeDomainReadyTimestamp != nil
		})
	target := nodeOf(t, nodes, moved)
	waitCounterPast(t, target.consolePath(moved), 0, 30*time.Second)
}
