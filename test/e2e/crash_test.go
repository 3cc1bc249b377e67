package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// "Never two, never none": whatever part of lifeboat dies during a migration, the guest runs on
// exactly one node. Each test here kills one part mid-migration and checks that the guest never
// ran on two nodes at once, kept counting, and that the evacuation still ends with the VM on the
// other node once the part is back.

// slowMigrations keeps a migration running for as long as a test needs: 1 MiB/s (the guest's
// kernel and initramfs alone take half a minute) and no escalation.
func slowMigrations(c *v1alpha1.LifeboatConfig) {
	c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("1Mi"))
	c.Spec.Migrations.AllowAutoConverge, c.Spec.Migrations.AllowPause = ptr.To(false), ptr.To(false)
}

// liveMigrateVM is a running LiveMigrate VM, its node, and its guest's counter. Its guest does
// not dirty memory on purpose: under TCG a guest that does can arrive corrupted from a migration
// that needs more than one pass (docs/benchmarks.md), and these tests are about who runs it.
func liveMigrateVM(t *testing.T, nodes []*testNode, name string) (*v1alpha1.VirtualMachineInstance, *testNode, int) {
	t.Helper()
	vmi := createVMI(t, testNamespace(t), newVMI(name, strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Memory = resource.MustParse("256Mi")
	}))
	vmi = waitVMI(t, vmi.Namespace, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	return vmi, source, waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)
}

func TestKillingTheTargetLauncherMidMigration(t *testing.T) {
	setConfig(t, false, slowMigrations)
	startController(t)
	nodes := startNodes(t, 2)
	vmi, source, before := liveMigrateVM(t, nodes, "target-killed")
	sourcePod := launcherPod(t, vmi)
	watch := watchGuest(t, nodes, vmi)

	setMark(t, vmi, true)
	m := waitMigrationOf(t, vmi, "Running", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationRunning
	})
	target, err := cluster.Kube.CoreV1().Pods(vmi.Namespace).Get(context.Background(), m.Status.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(launcherPID(t, target), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the target launcher of %s in pod %s", m.Name, target.Name)

	failed := waitMigrationOf(t, vmi, "Failed with a reason", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Name == m.Name && x.Status.Phase == v1alpha1.MigrationFailed && x.Status.FailureReason != ""
	})
	t.Logf("migration %s failed: %s", failed.Name, failed.Status.FailureReason)
	// Checked before the retry, which waits out its backoff (5 s) and may then succeed at once.
	if v := waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running", running); v.Status.NodeName != source.Name() || v.Status.EvacuationNodeName != source.Name() {
		t.Errorf("after a failed migration the VM runs on %s and stays marked: %s", source.Name(), describe(v))
	}
	// The descheduler still sees an eviction in progress: the mark stays for the retry.
	pod, err := cluster.Kube.CoreV1().Pods(vmi.Namespace).Get(context.Background(), sourcePod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Annotations[v1alpha1.AnnotationEvictionInProgress]; !ok {
		t.Errorf("the source pod %s must keep %s across a failed attempt: %v", pod.Name, v1alpha1.AnnotationEvictionInProgress, pod.Annotations)
	}
	waitCounterPast(t, source.consolePath(vmi), before+2, 30*time.Second)
	waitGone(t, target)
	finishEvacuation(t, nodes, vmi, source, m)
	watch.check(t)
}

func TestKillingTheSourceAgentMidMigration(t *testing.T) {
	setConfig(t, false, slowMigrations)
	startController(t)
	nodes := startNodes(t, 2)
	vmi, source, before := liveMigrateVM(t, nodes, "agent-killed")
	watch := watchGuest(t, nodes, vmi)

	setMark(t, vmi, true)
	m := waitMigrationOf(t, vmi, "Running", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationRunning
	})
	source.agent.Kill()
	t.Logf("killed the source agent on %s while %s ran", source.Name(), m.Name)
	source.agent.start(t)

	failed := waitMigrationOf(t, vmi, "Failed with a reason", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Name == m.Name && x.Status.Phase == v1alpha1.MigrationFailed && x.Status.FailureReason != ""
	})
	t.Logf("migration %s failed: %s", failed.Name, failed.Status.FailureReason)
	waitCounterPast(t, source.consolePath(vmi), before+2, 30*time.Second)
	if v := waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running", running); v.Status.NodeName != source.Name() {
		t.Errorf("after the broken migration the VM runs on %s: %s", source.Name(), describe(v))
	}
	finishEvacuation(t, nodes, vmi, source, m)
	watch.check(t)
}

func TestKillingTheControllerMidMigration(t *testing.T) {
	setConfig(t, false)
	controller := startController(t)
	nodes := startNodes(t, 2)
	vmi, source, before := liveMigrateVM(t, nodes, "controller-killed")
	watch := watchGuest(t, nodes, vmi)

	setMark(t, vmi, true)
	m := waitMigrationOf(t, vmi, "created", func(*v1alpha1.VirtualMachineInstanceMigration) bool { return true })
	controller.Kill()
	t.Logf("killed the controller once %s existed (phase %q)", m.Name, m.Status.Phase)
	controller.start(t)

	moved := waitVMI(t, vmi.Namespace, vmi.Name, 2*time.Minute, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	target := nodeOf(t, nodes, moved)
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)
	waitMigrationOf(t, vmi, "Succeeded", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Name == m.Name && x.Status.Phase == v1alpha1.MigrationSucceeded
	})
	migrations, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(vmi.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(vmi.UID)})
	if err != nil || len(migrations.Items) != 1 {
		t.Errorf("the restarted controller resumes the migration it had, and makes no other: %v, %d migrations", err, len(migrations.Items))
	}
	pods, err := cluster.Kube.CoreV1().Pods(vmi.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(vmi.UID)})
	if err != nil || len(pods.Items) != 2 {
		t.Errorf("want the source and one target pod: %v, %d pods", err, len(pods.Items))
	}
	watch.check(t)
}

// finishEvacuation lifts the bandwidth cap and waits for the evacuation controller's retry of
// the still-marked VM to move it: the failure lost nothing and left nothing stuck.
func finishEvacuation(t *testing.T, nodes []*testNode, vmi *v1alpha1.VirtualMachineInstance, source *testNode, failed *v1alpha1.VirtualMachineInstanceMigration) {
	t.Helper()
	setConfig(t, false)
	retried := waitMigrationOf(t, vmi, "a retry", func(x *v1alpha1.VirtualMachineInstanceMigration) bool { return x.Name != failed.Name })
	t.Logf("the evacuation controller retried with %s", retried.Name)
	moved := waitVMI(t, vmi.Namespace, vmi.Name, 2*time.Minute, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	target := nodeOf(t, nodes, moved)
	waitCounterPast(t, target.consolePath(moved), lastCounterOn(t, source.consolePath(vmi))+2, 30*time.Second)
}

// waitMigrationOf waits for a migration of the VMI for which cond holds.
func waitMigrationOf(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, what string, cond func(*v1alpha1.VirtualMachineInstanceMigration) bool) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	var found *v1alpha1.VirtualMachineInstanceMigration
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(vmi.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: v1alpha1.LabelVMIUID + "=" + string(vmi.UID)})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for i := range list.Items {
			x := &list.Items[i]
			seen = append(seen, fmt.Sprintf("%s:%s:%s", x.Name, x.Status.Phase, x.Status.FailureReason))
			if cond(x) {
				found = x
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("want a migration of %s %s within 2m; seen (name:phase:reason) %v", vmi.Name, what, seen)
	}
	return found
}

func waitGone(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s must be deleted within a minute", pod.Namespace, pod.Name)
	}
}

func lastCounterOn(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return guest.Counter(string(b))
}

// guestWatch samples, through each node's launcher libvirt, on which nodes a VMI's guest runs.
type guestWatch struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples int
	two     []string // moments the guest ran on two nodes
}

// watchGuest starts sampling until check. A sample that sees the guest Running on two nodes is
// taken again in the reverse order: libvirt pauses the source before the target resumes, so
// one of the two orders reads the target first, and two Running guests in both are real.
func watchGuest(t *testing.T, nodes []*testNode, vmi *v1alpha1.VirtualMachineInstance) *guestWatch {
	w := &guestWatch{stop: make(chan struct{}), done: make(chan struct{})}
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	conns := make([]*domain.Conn, len(nodes))
	runningOn := func(i int) bool {
		if conns[i] == nil {
			socket := filepath.Join(nodes[i].HostPath("/var/run/lifeboat"), "domains", string(vmi.UID), "libvirt-sock")
			if _, err := os.Stat(socket); err != nil {
				return false
			}
			c, err := domain.Connect(socket)
			if err != nil {
				return false
			}
			conns[i] = c
		}
		info, err := conns[i].Lookup(name)
		if err != nil {
			if !errors.Is(err, domain.ErrNotFound) {
				conns[i].Close()
				conns[i] = nil
			}
			return false
		}
		return info.State == domain.Running
	}
	pass := func(order []int) []string {
		var on []string
		for _, i := range order {
			if runningOn(i) {
				on = append(on, nodes[i].Name())
			}
		}
		return on
	}
	forward, reverse := make([]int, len(nodes)), make([]int, len(nodes))
	for i := range nodes {
		forward[i], reverse[len(nodes)-1-i] = i, i
	}
	go func() {
		defer close(w.done)
		defer func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			on := pass(forward)
			if len(on) > 1 {
				if again := pass(reverse); len(again) > 1 {
					w.mu.Lock()
					w.two = append(w.two, fmt.Sprintf("%s on %v", time.Now().Format(time.RFC3339Nano), again))
					w.mu.Unlock()
				}
			}
			w.mu.Lock()
			w.samples++
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *guestWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// check ends the watch and fails the test if the guest ever ran on two nodes.
func (w *guestWatch) check(t *testing.T) {
	t.Helper()
	w.end()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.two) > 0 {
		t.Errorf("the guest ran on two nodes at once: %v", w.two)
		return
	}
	t.Logf("%d samples of where the guest runs, never on two nodes at once", w.samples)
}

// waitMigrationEnded waits for the VMI's migration to reach a final phase. The VMI's status and the
// migration's are written by different agents, so a VMI seen on its new node does not mean its
// migration's status says so yet.
func waitMigrationEnded(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	return waitMigrationOf(t, vmi, "ended", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationSucceeded || m.Status.Phase == v1alpha1.MigrationFailed
	})
}

// TestStoppingTheTargetAgentAtTheSwitchOverLeavesOneCopy is the one-hour soak's failure at
// cf2f01d: the target node's agent killed as the migration switched over. The destination's
// libvirt had run the guest, its answer to the source went with the agent's proxy, and the
// source's libvirt ran its own copy again: two copies for 5.5 s. Now the destination holds the
// guest paused until the source's QEMU has ended. The target's agent is stopped (SIGSTOP, its
// proxies frozen) the moment the guest is paused there. Either the source never hears back and
// runs its guest on (the target's copy must stay paused), or it heard just before: its QEMU ends,
// its launcher's hand-off cannot pass the frozen proxy, and the target's agent, killed and started
// again, runs the guest it finds arrived and recorded complete. Both ways the guest runs on one
// node at a time and counts on.
func TestStoppingTheTargetAgentAtTheSwitchOverLeavesOneCopy(t *testing.T) {
	setConfig(t, false)
	startController(t)
	nodes := startNodes(t, 2)
	vmi, source, before := liveMigrateVM(t, nodes, "target-agent-stopped")
	watch := watchGuest(t, nodes, vmi)
	target := nodes[0]
	if target == source {
		target = nodes[1]
	}
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	socket := filepath.Join(target.HostPath("/var/run/lifeboat"), "domains", string(vmi.UID), "libvirt-sock")

	setMark(t, vmi, true)
	var conn *domain.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	// The destination finished receiving the guest: paused on arrival, or, were the guest run
	// there at once as libvirt does by itself, running.
	arrived := func() bool {
		if conn == nil {
			if _, err := os.Stat(socket); err != nil {
				return false
			}
			c, err := domain.Connect(socket)
			if err != nil {
				return false
			}
			conn = c
		}
		state, reason, err := conn.State(name)
		return err == nil && (state == domain.Paused && reason == domain.ReasonUser || state == domain.Running && reason == domain.ReasonMigrated)
	}
	// Looked at every millisecond: the agent must be stopped before it carries the answer back.
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return arrived(), nil
	}); err != nil {
		t.Fatalf("the guest was not seen arriving on %s within 2 minutes: %v", target.Name(), err)
	}
	if err := syscall.Kill(target.agent.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped the agent of %s as the guest arrived there", target.Name())
	// The source's libvirt waits for the frozen peer until its keepalive gives up.
	ended := waitMigrationEnded(t, vmi)
	t.Logf("migration %s ended %s: %s", ended.Name, ended.Status.Phase, ended.Status.FailureReason)
	state, reason, err := conn.State(name)
	stillPaused := err == nil && state == domain.Paused && reason == domain.ReasonUser
	target.agent.Kill()
	target.agent.start(t)

	if ended.Status.Phase != v1alpha1.MigrationSucceeded {
		expectRunningOn(t, source, vmi, before, false)
	} else {
		// With the guest still paused, the source gave it up and its hand-off could not pass:
		// the target's agent runs it.
		expectRunningOn(t, target, vmi, before, stillPaused)
	}
	watch.check(t)
}

// expectRunningOn waits for the VM running on n and its guest counting past before; fallback:
// the guest got there paused and n's agent ran it (Event and metric).
func expectRunningOn(t *testing.T, n *testNode, vmi *v1alpha1.VirtualMachineInstance, before int, fallback bool) {
	t.Helper()
	if fallback {
		kubewait.Event(t, cluster.Kube, vmi.Namespace, fields.Set{"involvedObject.name": vmi.Name, "reason": agent.ReasonResumedOnArrival}, time.Minute)
		if got := n.metric(t, "lifeboat_agent_guests_resumed_on_arrival_total"); got != 1 {
			t.Errorf("the agent of %s counts %v guests resumed on arrival, want 1", n.Name(), got)
		}
	}
	v := waitVMI(t, vmi.Namespace, vmi.Name, time.Minute, "Running on "+n.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMIRunning && v.Status.NodeName == n.Name()
	})
	waitCounterPast(t, n.consolePath(v), before+2, time.Minute)
}

// TestAGuestTheHandOffCannotReachRunsOnceItsMigrationIsRecorded: the source's QEMU ended, so the
// guest waits paused on the target, but the source launcher cannot reach the target's libvirt to
// run it there (the link broke just then; here its socket is taken away once the memory moves, so
// only the hand-off's new connection misses it). The source's agent records the migration
// complete, and the target's agent, seeing the guest paused on arrival, runs it.
func TestAGuestTheHandOffCannotReachRunsOnceItsMigrationIsRecorded(t *testing.T) {
	setConfig(t, false, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("8Mi"))
	})
	startController(t)
	nodes := startNodes(t, 2)
	vmi, source, before := liveMigrateVM(t, nodes, "handoff-cut")
	watch := watchGuest(t, nodes, vmi)

	setMark(t, vmi, true)
	m := waitMigrationOf(t, vmi, "moving memory", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		p := m.Status.Progress
		return m.Status.Phase == v1alpha1.MigrationRunning && p != nil && p.DataRemaining > 0 && p.DataRemaining < p.DataTotal
	})
	socket := filepath.Join(source.HostPath("/var/run/lifeboat"), "domains", string(vmi.UID), domain.MigrationLibvirtSocket)
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	t.Logf("removed %s's proxy socket to the target's libvirt while %s moved memory", source.Name(), m.Name)

	ended := waitMigrationEnded(t, vmi)
	if ended.Status.Phase != v1alpha1.MigrationSucceeded {
		t.Fatalf("migration %s ended %s (%s), want Succeeded: the source's libvirt kept its own connection", ended.Name, ended.Status.Phase, ended.Status.FailureReason)
	}
	target := nodes[0]
	if target == source {
		target = nodes[1]
	}
	expectRunningOn(t, target, vmi, before, true)
	watch.check(t)
}
