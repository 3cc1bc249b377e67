package stockcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"regexp"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
)

// headroom is how far below memory.available the test raises the VM node's hard threshold: the
// allocator takes the machine toward it, never across (so nothing else here is evicted).
const headroom = 3 << 30

// allocStep is how much the allocator takes at a time, allocStepEvery how often: 50 MiB/s, 100 MiB
// between two of the agent's relief reads (every 2 s), a fifth of relief's default margin.
const (
	allocStep      = 32
	allocStepEvery = 640 * time.Millisecond
)

// targetShare is what the allocator gives back once the VM is marked: the migration's target is
// on this same machine, so the VM arriving there (its memory and its launcher's) lowers the source
// node's memory.available, which on a machine of its own it would not.
const targetShare = 512

// raiseHardThreshold restarts the node's kubelet with its hard memory.available threshold
// headroom below memory.available now (no soft threshold, no grace: the defaults), and restarts
// its agent so that it reads the new setting; cleanup puts the default back. It returns the
// threshold in bytes.
func (s *stock) raiseHardThreshold(t testing.TB, n *realnode.Node) int64 {
	t.Helper()
	var avail int64
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		a, err := n.MemoryAvailable(ctx)
		avail = a
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no memory.available from %s's kubelet: %v", n.Name(), err)
	}
	threshold := avail - headroom
	q := resource.NewQuantity(threshold, resource.BinarySI).String()
	if err := n.RestartKubelet(t.Context(), func(c *kubeletv1beta1.KubeletConfiguration) { stockKubelet(c, &q) }); err != nil {
		t.Fatal(err)
	}
	s.restartAgent(t.Context(), t, n.Name())
	t.Cleanup(func() {
		if err := n.RestartKubelet(context.Background(), func(c *kubeletv1beta1.KubeletConfiguration) { stockKubelet(c, nil) }); err != nil {
			t.Errorf("restoring %s's kubelet: %v", n.Name(), err)
		}
		s.restartAgent(context.Background(), t, n.Name())
	})
	t.Logf("%s: memory.available %s; the kubelet's hard threshold raised to memory.available<%s", n.Name(),
		resource.NewQuantity(avail, resource.BinarySI), q)
	return threshold
}

// restartAgent deletes the node's agent pod (the DaemonSet makes another) and waits for both agents.
func (s *stock) restartAgent(ctx context.Context, t testing.TB, node string) {
	t.Helper()
	s.shellContext(ctx, t, os.TempDir(), "kubectl delete pod -n lifeboat-system -l app.kubernetes.io/name=lifeboat-agent --field-selector spec.nodeName="+node)
	s.waitReady(t, "app.kubernetes.io/name=lifeboat-agent", 2)
}

// allocator is the test binary as a process that holds memory on the machine.
type allocator struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	mib int
}

func startAllocator(t testing.TB) *allocator {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), allocatorEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &allocator{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(a.release)
	return a
}

// take allocates mib more (gives back -mib) and waits until it is done.
func (a *allocator) take(mib int) error {
	if _, err := fmt.Fprintln(a.in, mib); err != nil {
		return err
	}
	if !a.out.Scan() || a.out.Text() != "ok" {
		return fmt.Errorf("the allocator did not take %d MiB: %q %v", mib, a.out.Text(), a.out.Err())
	}
	a.mib += mib
	return nil
}

// release frees everything (the process ends).
func (a *allocator) release() {
	if a.cmd.Process == nil || a.cmd.ProcessState != nil {
		return
	}
	_ = a.in.Close()
	_ = a.cmd.Wait()
}

// pressureResult is what the pressure test measured: memory.available as the agent read it when it
// moved the VM, and the kubelet's hard threshold, from the agent's Event on the Node.
type pressureResult struct {
	availableAtMark, threshold int64
	moved                      time.Duration // from the mark to the VM running on the other node
}

// reliefEvent matches the agent's Event on the Node when relief moves VMs (agent/relief.go).
var reliefEvent = regexp.MustCompile(`memory\.available on node \S+ is (\S+), within \S+ of the kubelet's eviction threshold ([^:;]+)`)

// reliefFigures reads memory.available and the threshold from the agent's relief Event on the node.
func (s *stock) reliefFigures(t testing.TB, node string) (available, threshold int64) {
	t.Helper()
	e := kubewait.Event(t, s.cp.Kube, "default", fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node,
		"reason": string(v1alpha1.MigrationCauseNodePressureRelief)}, 30*time.Second)
	m := reliefEvent.FindStringSubmatch(e.Message)
	if m == nil {
		t.Fatalf("the relief Event's message does not say memory.available and the threshold: %q", e.Message)
	}
	a, err := resource.ParseQuantity(m[1])
	if err != nil {
		t.Fatal(err)
	}
	th, err := resource.ParseQuantity(m[2])
	if err != nil {
		t.Fatal(err)
	}
	return a.Value(), th.Value()
}

// testPressure: memory use climbs toward the VM node's hard threshold, the kubelet's defaults but
// for its value; lifeboat's relief, at its defaults, moves the VM before the kubelet evicts anything.
func (s *stock) testPressure(t testing.TB) pressureResult {
	ns := s.namespace(t, fmt.Sprintf("pressure-%d", time.Now().UnixNano()%100000))
	v := s.vm(t, ns, "vm", v1alpha1.EvictionStrategyLiveMigrate)
	v = s.waitVMI(t, ns, v.Name, bootTimeout, "Running and LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		ok, _ := v.LiveMigratable()
		return v.Status.Phase == v1alpha1.VMIRunning && ok
	})
	var n *realnode.Node
	for _, c := range s.nodes {
		if c.Name() == v.Status.NodeName {
			n = c
		}
	}
	threshold := s.raiseHardThreshold(t, n)
	alloc := startAllocator(t)
	var availableAtMark int64
	var markedAt time.Time
	// Climb until lifeboat marks the VM; never within 128 MiB of the threshold.
	err := wait.PollUntilContextTimeout(t.Context(), allocStepEvery, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		cur, err := s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		avail, err := n.MemoryAvailable(ctx)
		if err != nil {
			return false, nil
		}
		if cur.MarkedForEvacuation() || cur.Status.NodeName != n.Name() {
			availableAtMark, markedAt = avail, time.Now()
			return true, nil
		}
		if avail-allocStep<<20 < threshold+128<<20 {
			return false, fmt.Errorf("memory.available %s is near the hard threshold %s and the VM is not marked (%d MiB allocated)",
				resource.NewQuantity(avail, resource.BinarySI), resource.NewQuantity(threshold, resource.BinarySI), alloc.mib)
		}
		return false, alloc.take(allocStep)
	})
	if err != nil {
		t.Fatalf("waiting for lifeboat to move the VM as memory use climbs: %v", err)
	}
	if err := alloc.take(-targetShare); err != nil {
		t.Fatal(err)
	}
	agentAvailable, agentThreshold := s.reliefFigures(t, n.Name())
	t.Logf("lifeboat marked the VM at memory.available %s as its agent read it (the kubelet's summary: %s), %s above the hard threshold %s (%d MiB allocated)",
		resource.NewQuantity(agentAvailable, resource.BinarySI), resource.NewQuantity(availableAtMark, resource.BinarySI),
		resource.NewQuantity(agentAvailable-agentThreshold, resource.BinarySI), resource.NewQuantity(agentThreshold, resource.BinarySI), alloc.mib)
	moved := s.waitVMI(t, ns, v.Name, 3*time.Minute, "moved off "+n.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMIRunning && v.Status.NodeName != n.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	took := time.Since(markedAt)
	alloc.release()
	if c := moved.Status.MigrationState.Cause; c != v1alpha1.MigrationCauseNodePressureRelief {
		t.Errorf("migration cause %s, want %s", c, v1alpha1.MigrationCauseNodePressureRelief)
	}
	evs, err := s.cp.Kube.CoreV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "reason=Evicted,source=kubelet"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		t.Errorf("the kubelet evicted %s/%s: %s", e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Message)
	}
	return pressureResult{availableAtMark: agentAvailable, threshold: agentThreshold, moved: took}
}
