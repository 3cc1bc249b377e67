package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// A node that stops answering (issue 47, item 3): every process of an emulated node is stopped
// (its kubelet, its agent, its launchers, their libvirt daemons and QEMUs), as when a machine
// freezes. Its VM with RunStrategy Always is not restarted while the node is only NotReady; once
// the node is tainted out of service it comes back on the other node; and when the frozen node
// resumes, its QEMU does not run on beside the new copy.
func TestAFrozenNodesVMComesBackElsewhereOnlyAfterTheOutOfServiceTaint(t *testing.T) {
	setConfig(t, false)
	startController(t)
	nodes := startNodes(t, 2)
	ns := testNamespace(t)
	vm := newVM("frozen", v1alpha1.RunStrategyAlways)
	allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	frozen := nodeOf(t, nodes, old)
	other := nodes[0]
	if other == frozen {
		other = nodes[1]
	}
	oldConsole := frozen.consolePath(old)
	before := waitCounterPast(t, oldConsole, 1, bootTimeout)

	stopped := freezeNode(t, frozen)
	qemu := qemuOf(stopped)
	if qemu == 0 {
		t.Fatalf("no QEMU among the frozen processes of %s", frozen.Name())
	}
	t.Logf("froze node %s: %d processes (QEMU %d) at guest counter %d", frozen.Name(), len(stopped), qemu, before)

	waitNodeNotReady(t, frozen.Name(), 3*time.Minute)
	lost := waitVMI(t, ns, vm.Name, time.Minute, "NodeLost", func(v *v1alpha1.VirtualMachineInstance) bool {
		return meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VMIConditionNodeLost)
	})
	t.Logf("NodeLost: %s", meta.FindStatusCondition(lost.Status.Conditions, v1alpha1.VMIConditionNodeLost).Message)
	waitVM(t, ns, vm.Name, 30*time.Second, "WaitingForNode", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusWaitingForNode
	})
	// Not before the taint: the guest may still run there, for all the cluster knows.
	kubewait.Consistently(t, 30*time.Second, "the VM not restarted while its node is only NotReady", func(ctx context.Context) error {
		v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, vm.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v.UID != old.UID || v.Status.Phase.Terminal() {
			return fmt.Errorf("instance %s is %s: %s", v.UID, v.Status.Phase, v.Status.Message)
		}
		return nil
	})

	taintOutOfService(t, frozen.Name())
	again := waitVMI(t, ns, vm.Name, 2*bootTimeout, "a new instance Running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID != old.UID && running(v)
	})
	if again.Status.NodeName != other.Name() {
		t.Fatalf("the new instance runs on %s, want %s", again.Status.NodeName, other.Name())
	}
	newCounter := waitCounterPast(t, other.consolePath(again), 1, bootTimeout)
	t.Logf("after the out-of-service taint instance %s runs on %s (counter %d)", again.UID, other.Name(), newCounter)

	// The frozen node resumes, its QEMU with it: it must end, not count on beside the new copy.
	thawNode(frozen, stopped)
	thawed := time.Now()
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return !processAlive(qemu), nil
	}); err != nil {
		t.Fatalf("the old QEMU %d on %s still runs a minute after the node resumed", qemu, frozen.Name())
	}
	t.Logf("the old QEMU on %s ended %s after the node resumed", frozen.Name(), time.Since(thawed).Round(time.Millisecond))
	// One copy counts: the old console stays where it ended, the new one goes on.
	last := counterIn(oldConsole)
	newCounter = waitCounterPast(t, other.consolePath(again), newCounter+3, 30*time.Second)
	if now := counterIn(oldConsole); now > last {
		t.Errorf("the old guest counted on after its QEMU ended: %d, then %d", last, now)
	}
	if v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), vm.Name, metav1.GetOptions{}); err != nil || v.UID != again.UID || v.Status.NodeName != other.Name() {
		t.Errorf("after the node resumed the VM's instance is %v (%v); want %s on %s", v, err, again.UID, other.Name())
	}
	t.Logf("the new guest counts on (%d); the old one stopped at %d", newCounter, last)

	// What the agent says on its return: the outage on its Node, and the stray guest if it was
	// the one that ended it (the kubelet's kill of the deleted pod may come first).
	kubewait.Event(t, cluster.Kube, metav1.NamespaceDefault, fields.Set{"involvedObject.name": frozen.Name(), "reason": agent.ReasonAPIServerContactRestored}, 2*time.Minute)
	events, err := cluster.Kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.uid": string(old.UID)}.String()})
	if err == nil {
		for _, e := range events.Items {
			if e.Reason == agent.ReasonStrayGuestDestroyed || e.Reason == vmi.ReasonNodeOutOfService || e.Reason == vmi.ReasonNodeLost {
				t.Logf("event on the old instance: %s: %s", e.Reason, e.Message)
			}
		}
	}
}

// freezeNode stops an emulated node as a whole: its kubelet (Freeze), then every process of its
// pods and its agent (SIGSTOP). It returns the stopped pids; the test thaws them (thawNode), and
// its end does if it fails first.
func freezeNode(t *testing.T, n *testNode) []int {
	t.Helper()
	n.Freeze()
	pids := append(descendants(n.ContainerPIDs()), n.agent.Pid())
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("stopping process %d of node %s: %v", pid, n.Name(), err)
		}
	}
	t.Cleanup(func() { thawNode(n, pids) })
	return pids
}

// thawNode resumes what freezeNode stopped.
func thawNode(n *testNode, pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	n.Thaw()
}

// descendants are the pids of roots and of every process below them.
func descendants(roots []int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid := parentOf(pid); ppid > 0 {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, pid)
		queue = append(queue, children[pid]...)
	}
	return out
}

// parentOf reads a process's parent pid from /proc/pid/stat; 0 if it cannot.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// qemuOf is the QEMU among pids; 0 if none.
func qemuOf(pids []int) int {
	for _, pid := range pids {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if strings.HasPrefix(filepath.Base(exe), "qemu-system") {
			return pid
		}
	}
	return 0
}

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// counterIn is the guest counter in a console log; 0 if it cannot be read (its directory went
// with its pod).
func counterIn(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return guest.Counter(string(b))
}

// waitNodeNotReady waits for the node lifecycle controller to find the node NotReady.
func waitNodeNotReady(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status != corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("node %s still Ready %s after it froze", name, timeout)
	}
	t.Logf("node %s NotReady %s after it froze", name, time.Since(start).Round(time.Second))
}

// taintOutOfService is what the admin does once the node is known to be off.
func taintOutOfService(t *testing.T, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
		_, err = cluster.Kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tainted node %s: %s", name, vmi.OutOfServiceTaintCommand(name))
}
