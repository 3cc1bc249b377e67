package e2e

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
)

const (
	// reliefMargin is the LifeboatConfig's relief margin in the real node's relief test.
	reliefMargin = 512 << 20
	// hogChunk is how much memory the hog takes at a time.
	hogChunk = 16 << 20
	// hogRate is how fast the node's memory use grows while the test presses it.
	hogRate = 16 << 20
)

// memoryHog holds memory in this process. The kubelet's memory.available counts every process on
// the machine (it is computed from the root cgroup), so the hog is how the test moves the node's
// memory use, with no pod the kubelet could evict for it.
type memoryHog struct{ chunks [][]byte }

// add takes one more chunk and touches each of its pages, so that they are resident.
func (h *memoryHog) add() {
	b := make([]byte, hogChunk)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	h.chunks = append(h.chunks, b)
}

// pop gives one chunk back to the machine.
func (h *memoryHog) pop() {
	h.chunks = h.chunks[:len(h.chunks)-1]
	debug.FreeOSMemory()
}

// release gives all the memory back to the machine.
func (h *memoryHog) release() {
	h.chunks = nil
	runtime.GC()
	debug.FreeOSMemory()
}

// follow keeps memory.available plus vmUsage (the working set of the VM's pods on the real node)
// at plan(time since the start), within a chunk, until ctx ends. That sum is what the real node
// would have free without its VMs: the VM leaving the node adds its memory to memory.available,
// while the test's other processes (the emulated node that receives the VM runs on this machine
// too) and the kernel's ageing of file pages are made up for by the hog, as if they were on
// another machine.
func (h *memoryHog) follow(ctx context.Context, plan func(time.Duration) uint64, vmUsage func() uint64) {
	start := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		want := plan(time.Since(start))
	adjust:
		for range 256 {
			available, err := memoryAvailable()
			if err != nil {
				break
			}
			switch have := available + vmUsage(); {
			case have > want+hogChunk/2:
				h.add()
			case have+hogChunk/2 < want && len(h.chunks) > 0:
				h.pop()
			default:
				break adjust
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// memoryAvailable is the machine's memory.available as the kubelet and the agent compute it
// (pressure.ReadMemory, which test/realnode shows to agree with the kubelet's within 16 MiB).
func memoryAvailable() (uint64, error) {
	m, err := pressure.ReadMemory("/proc", "/sys/fs/cgroup")
	return m.Available(), err
}

// nodeMemoryAvailable is memoryAvailable on the test's goroutine, failing the test on an error.
func nodeMemoryAvailable(t testing.TB) uint64 {
	t.Helper()
	available, err := memoryAvailable()
	if err != nil {
		t.Fatal(err)
	}
	return available
}

// lowestAvailable samples memory.available every 100 ms until the returned function is called,
// which returns the lowest value seen.
func lowestAvailable() func() uint64 {
	var mu sync.Mutex
	lowest := uint64(1<<64 - 1)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if available, err := memoryAvailable(); err == nil {
				mu.Lock()
				lowest = min(lowest, available)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return lowest
	}
}

// kubeletEvictions counts the kubelet's Evicted Events in every namespace since a time.
func kubeletEvictions(ctx context.Context, since time.Time) (int, []string, error) {
	list, err := cluster.Kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"reason": "Evicted", "source": "kubelet"}.String()})
	if err != nil {
		return 0, nil, err
	}
	n, pods := 0, []string{}
	for _, e := range list.Items {
		if at := e.LastTimestamp.Time; at.IsZero() && e.EventTime.After(since) || at.After(since) {
			n += max(1, int(e.Count))
			pods = append(pods, fmt.Sprintf("%s/%s ×%d", e.InvolvedObject.Namespace, e.InvolvedObject.Name, max(1, e.Count)))
		}
	}
	return n, pods, nil
}

// pressedRun is what one pressing of the real node cost: the kubelet's evictions, the moved VM's
// downtime (libvirt's, as its target launcher logged it) and the lowest memory.available seen.
type pressedRun struct {
	evictions int
	evicted   []string // namespace/name ×count of each pod the kubelet evicted
	downtime  time.Duration
	lowest    uint64
}

// pressRealNode presses the real node as its own memory use growing at hogRate would: from just
// above the relief line (threshold + margin) down by the margin and half of what the VM's pod
// uses. Without a move, memory.available ends half the VM's pod below the kubelet's threshold;
// with the VM moved away, half of it above. It returns once the VM runs on target, moved for
// cause, and the kubelet has had time to act on the lowest point.
func pressRealNode(t testing.TB, real *realnode.Node, target *testNode, vmi *v1alpha1.VirtualMachineInstance, before int, threshold uint64, cause v1alpha1.MigrationCause) pressedRun {
	t.Helper()
	pod := launcherPod(t, vmi)
	usage, ok := pressure.PodWorkingSet("/sys/fs/cgroup", string(pod.UID))
	if !ok || usage < 128<<20 {
		t.Fatalf("the VM's pod %s has a working set of %d MiB (found: %v); the test needs at least 128 MiB to tell a move from noise", pod.Name, usage>>20, ok)
	}
	vmUsage := func() uint64 {
		ws, _ := pressure.PodWorkingSet("/sys/fs/cgroup", string(pod.UID))
		return ws
	}
	from := threshold + reliefMargin + 64<<20 + usage
	to := threshold + usage/2
	ramp := time.Duration(float64(from-to) / hogRate * float64(time.Second))
	plan := func(d time.Duration) uint64 {
		if d >= ramp {
			return to
		}
		return from - uint64(d.Seconds()*hogRate)
	}
	since := time.Now()
	lowest := lowestAvailable()
	ctx, cancel := context.WithCancel(t.Context())
	hog := &memoryHog{}
	following := make(chan struct{})
	go func() {
		defer close(following)
		hog.follow(ctx, plan, vmUsage)
	}()
	logging := make(chan struct{})
	defer func() {
		cancel()
		<-following
		<-logging
		hog.release()
	}()
	// What the test and the kubelet see, every 10 s, for whoever reads the log of a failure.
	go func() {
		defer close(logging)
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			here, _ := memoryAvailable()
			kubelet, at, err := real.MemoryAvailableAt(ctx)
			t.Logf("memory.available: %d MiB here, the kubelet's %d MiB at %s (%v); the VM's pod on %s uses %d MiB; threshold %d MiB",
				here>>20, kubelet>>20, at.Format("15:04:05"), err, real.Name(), vmUsage()>>20, threshold>>20)
		}
	}()
	moved := waitVMI(t, vmi.Namespace, vmi.Name, 3*time.Minute, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	if got := moved.Status.MigrationState.Cause; got != cause {
		t.Errorf("the VM moved for %s, want %s", got, cause)
	}
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)
	run := pressedRun{downtime: arrivalDowntime(t, target, launcherPodOn(t, moved, target.Name()))}
	if rest := ramp - time.Since(since); rest > 0 {
		t.Logf("the node's memory use grows for %s more", rest.Round(time.Second))
		<-time.After(rest)
	}
	// The kubelet's eviction manager looks every 10 s and evicts after the soft grace period
	// (5 s): what it saw of the pressed node, it has acted on within 20 s.
	kubewait.Consistently(t, 20*time.Second, "the node's evictions counted", func(ctx context.Context) error {
		// Not bounded by the window: a List that the client's rate limiter would let through only
		// after it is not a failure to count.
		n, pods, err := kubeletEvictions(context.WithoutCancel(ctx), since)
		if err == nil {
			run.evictions, run.evicted = n, pods
		}
		return err
	})
	t.Logf("the kubelet evicted %d pod(s): %v", run.evictions, run.evicted)
	run.lowest = lowest()
	return run
}

// TestRealNodeReliefMovesTheVMBeforeTheKubeletMustEvict: on the real kubelet node, the machine's
// memory use grows at 16 MiB/s towards the kubelet's soft threshold, by more than would cross it
// (by half the VM pod's working set). With node-pressure relief on, the agent moves the VM when
// memory.available comes within the margin, and the kubelet evicts nothing: memory.available
// never reaches the threshold. In the same run, with relief off, the same growth crosses the
// threshold, the kubelet evicts the VM's pod and lifeboat live-migrates it within the grace
// period. Both report the kubelet's evictions, the VM's downtime and the lowest memory.available.
func TestRealNodeReliefMovesTheVMBeforeTheKubeletMustEvict(t *testing.T) {
	on, off, threshold := reliefOnAndOff(t)
	mib := func(b uint64) int64 { return int64(b) >> 20 }
	t.Logf("kubelet soft threshold memory.available < %d MiB, relief margin %d MiB, growth %d MiB/s", mib(threshold), mib(reliefMargin), mib(hogRate))
	t.Logf("| relief | kubelet evictions | VM downtime (libvirt) | lowest memory.available | vs threshold |")
	for _, r := range []struct {
		name string
		run  pressedRun
	}{{"on", on}, {"off", off}} {
		t.Logf("| %s | %d | %s | %d MiB | %+d MiB |", r.name, r.run.evictions, r.run.downtime.Round(time.Millisecond), mib(r.run.lowest), mib(r.run.lowest)-mib(threshold))
	}
	if on.evictions != 0 || on.lowest <= threshold {
		t.Errorf("with relief on: %d kubelet evictions, lowest memory.available %d MiB; want none, and never down to the threshold %d MiB", on.evictions, mib(on.lowest), mib(threshold))
	}
	if off.evictions < 1 || off.lowest >= threshold {
		t.Errorf("with relief off: %d kubelet evictions, lowest memory.available %d MiB; want the threshold %d MiB crossed and the VM's pod evicted", off.evictions, mib(off.lowest), mib(threshold))
	}
}

// reliefOnAndOff presses the real node with relief on, then with relief off and a second VM (see
// TestRealNodeReliefMovesTheVMBeforeTheKubeletMustEvict), and returns both runs and the kubelet's
// soft threshold.
func reliefOnAndOff(t testing.TB) (on, off pressedRun, threshold uint64) {
	t.Helper()
	// The kubelet's soft threshold lies 4 GiB under what the machine has free now: what the node,
	// lifeboat and the VMs take before the test presses it leaves it far above.
	threshold = nodeMemoryAvailable(t) - 4<<30
	real := startRealNode(t, func(c *kubeletv1beta1.KubeletConfiguration) {
		c.EvictionSoft = map[string]string{"memory.available": resource.NewQuantity(int64(threshold), resource.BinarySI).String()}
	})
	deployLifeboat(t, real)
	relief := func(on bool) func(*v1alpha1.LifeboatConfig) {
		return func(c *v1alpha1.LifeboatConfig) {
			c.Spec.NodePressureRelief = &v1alpha1.NodePressureReliefConfig{Enabled: ptr.To(on), Margin: ptr.To(resource.MustParse(fmt.Sprint(reliefMargin)))}
		}
	}
	setConfig(t, true, relief(true))
	ns := testNamespace(t)
	relieved, before := realNodeVM(t, real, ns, "relieved")
	target := startNodes(t, 1, node.OnNetwork(real.Network()))[0]
	if avail := nodeMemoryAvailable(t); avail < threshold+reliefMargin+256<<20 {
		t.Fatalf("memory.available is %d MiB after the setup, too close to the relief line %d MiB to press the node from above it", avail>>20, (threshold+reliefMargin)>>20)
	}
	on = pressRealNode(t, real, target, relieved, before, threshold, v1alpha1.MigrationCauseNodePressureRelief)

	setConfig(t, true, relief(false))
	cordon(t, target.Name(), true)
	evicted, before := realNodeVM(t, real, ns, "evicted")
	cordon(t, target.Name(), false)
	off = pressRealNode(t, real, target, evicted, before, threshold, v1alpha1.MigrationCauseNodePressure)

	return on, off, threshold
}

// BenchmarkRealNodeRelief reports TestRealNodeReliefMovesTheVMBeforeTheKubeletMustEvict's figures
// as metrics, one pressing with relief on and one off per iteration, so that benchstat computes
// their medians over -count runs (make bench-relief).
func BenchmarkRealNodeRelief(b *testing.B) {
	for b.Loop() {
		on, off, threshold := reliefOnAndOff(b)
		for _, r := range []struct {
			name string
			run  pressedRun
		}{{"on", on}, {"off", off}} {
			b.ReportMetric(float64(r.run.evictions), "evictions-relief-"+r.name)
			b.ReportMetric(float64(r.run.downtime.Milliseconds()), "ms-downtime-relief-"+r.name)
			b.ReportMetric(float64(int64(r.run.lowest)-int64(threshold))/(1<<20), "MiB-lowest-above-threshold-relief-"+r.name)
		}
	}
}
