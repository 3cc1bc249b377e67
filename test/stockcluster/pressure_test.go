package stockcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
)

// headroom is how far below memory.available the test raises the VM node's hard threshold: the
// allocator takes the machine toward it, never across (so nothing else here is evicted).
const headroom = 3 << 30

// climbRate is how fast memory.available falls toward the threshold, in bytes a second: 100 MiB
// between two of the agent's relief reads (every 2 s), a fifth of relief's default margin.
// steerEvery is how often the allocator corrects, allocChunk by how much at most a step.
const (
	climbRate  = 50 << 20
	steerEvery = 250 * time.Millisecond
	allocChunk = 32
)

// machineAvailable is memory.available as the kubelet computes it and lifeboat's agent reads it
// (agent/pressure), now: the kubelet's summary serves figures up to its housekeeping period old.
func machineAvailable(t testing.TB) int64 {
	t.Helper()
	m, err := pressure.ReadMemory("/proc", "/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return int64(m.Available())
}

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
	if err := n.RestartKubelet(t.Context(), func(c *kubeletv1beta1.KubeletConfiguration) { stockKubelet(c, s.cp.CAFile(), &q) }); err != nil {
		t.Fatal(err)
	}
	s.restartAgent(t.Context(), t, n.Name())
	t.Cleanup(func() {
		if err := n.RestartKubelet(context.Background(), func(c *kubeletv1beta1.KubeletConfiguration) { stockKubelet(c, s.cp.CAFile(), nil) }); err != nil {
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

// steer allocates or gives back one chunk to bring memory.available from cur toward want.
func (a *allocator) steer(cur, want int64) error {
	switch diff := (cur - want) >> 20; {
	case diff > allocChunk:
		return a.take(allocChunk)
	case diff < -allocChunk && a.mib > 0:
		return a.take(-allocChunk)
	}
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
	// The allocator steers memory.available, as the agent reads it, down a ramp at 50 MiB/s and,
	// once lifeboat has marked the VM, holds it at relief's line (the threshold plus the default
	// 512 MiB margin): the pressure stops rising but does not go away. Steering, not a fixed
	// allocation, because other work on this shared machine takes and frees gigabytes, and the
	// migration's target is this machine too (on a machine of its own, the VM's memory arriving
	// at its target does not lower its source's memory.available).
	start := machineAvailable(t)
	began := time.Now()
	var markedAt time.Time
	var moved *v1alpha1.VirtualMachineInstance
	err := wait.PollUntilContextTimeout(t.Context(), steerEvery, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		cur, err := s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if markedAt.IsZero() && (cur.MarkedForEvacuation() || cur.Status.NodeName != n.Name()) {
			markedAt = time.Now()
		}
		if cur.Status.Phase == v1alpha1.VMIRunning && cur.Status.NodeName != n.Name() && cur.Status.MigrationState != nil && cur.Status.MigrationState.Completed {
			moved = cur
			return true, nil
		}
		want := max(start-int64(time.Since(began).Seconds()*climbRate), threshold+128<<20)
		if !markedAt.IsZero() {
			want = threshold + 512<<20
		}
		return false, alloc.steer(machineAvailable(t), want)
	})
	if err != nil {
		t.Fatalf("waiting for lifeboat to move the VM off %s as memory use climbs (marked: %t, %d MiB allocated): %v", n.Name(), !markedAt.IsZero(), alloc.mib, err)
	}
	agentAvailable, agentThreshold := s.reliefFigures(t, n.Name())
	t.Logf("lifeboat marked the VM at memory.available %s as its agent read it, %s above the hard threshold %s",
		resource.NewQuantity(agentAvailable, resource.BinarySI), resource.NewQuantity(agentAvailable-agentThreshold, resource.BinarySI),
		resource.NewQuantity(agentThreshold, resource.BinarySI))
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
