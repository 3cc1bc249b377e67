package e2e

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"strconv"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/internal/chart"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// The drain: -drain-vms small guests on one node marked at once (cause Drain), at most
// drainParallel leaving the node at a time (parallelOutboundMigrationsPerNode; the cluster's
// limit, drainClusterParallel, is higher). Issue 22's node full of VMs is -drain-vms=50.
const (
	drainParallel        = 2
	drainClusterParallel = 5
)

var drainVMs = flag.Int("drain-vms", 10, "VMs BenchmarkDrainThroughput drains from one node")

// agentIdleWindow is how long BenchmarkDrainThroughput takes the agent's CPU time with every VM
// running and nothing happening.
const agentIdleWindow = 30 * time.Second

// BenchmarkDrainThroughput marks drainVMs running VMs on one node for evacuation at once, as a
// drain does, and measures through the real cluster (controller, agents, launchers, libvirt,
// TCG guests) the time until all have left, against the sum of their migration times divided
// by the parallel limit, and each migration's controller overhead, from timestamps a watch
// sees and the source agent's log of when libvirt's migration ended.
func BenchmarkDrainThroughput(b *testing.B) {
	setConfig(b, false, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.ParallelMigrationsPerCluster = ptr.To[int32](drainClusterParallel)
		c.Spec.Migrations.ParallelOutboundMigrationsPerNode = ptr.To[int32](drainParallel)
	})
	_, controllerMetrics := startControllerWithMetrics(b)
	vms := *drainVMs
	// Room for every VM on either node: the node's requests are not what this measures.
	request := vmi.MemoryRequest(resource.MustParse("128Mi"), 1)
	memory := resource.NewQuantity(int64(vms)*request.Value()+(2<<30), resource.BinarySI)
	cpu := resource.NewMilliQuantity(int64(vms)*vmi.CPURequestPerVCPUMilli+4000, resource.DecimalSI)
	nodes := startNodes(b, 2, behindTheControlPlane(), func(c *node.Config) {
		c.EvictionMaxPodGracePeriod = 60
		c.Capacity = corev1.ResourceList{corev1.ResourceMemory: *memory, corev1.ResourceCPU: *cpu}
	})
	metrics := lifeboatMetrics(controllerMetrics, nodes)
	source, target := nodes[0], nodes[1]
	ns := testNamespace(b)
	// Runs of -count share the control plane: this run's VMIs and migrations must be gone
	// before the next starts, or they hold its parallel-migration slots. Registered after the
	// nodes, so it runs while they and their agents still do.
	b.Cleanup(func() { deleteNamespace(b, ns) })

	// Every VM starts on the source: the target takes no pods until they all run.
	cordon(b, target.Name(), true)
	printAgentMemory(b, source, "no VM")
	noVMRSS, noVMTree := processMemory(b, source.agent.Pid(), "VmRSS"), withChildren(b, source.agent.Pid())
	vmis := make([]*v1alpha1.VirtualMachineInstance, vms)
	for i := range vmis {
		vmis[i] = createVMI(b, ns, newVMI(fmt.Sprintf("drain-%d", i), strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	}
	for i, v := range vmis {
		vmis[i] = waitVMI(b, ns, v.Name, 2*bootTimeout, "phase Running on "+source.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
			return running(v) && v.Status.NodeName == source.Name()
		})
	}
	cordon(b, target.Name(), false)
	w := watchDrain(b, ns, source.Name())
	agents := []int{source.agent.Pid(), target.agent.Pid()}

	// The source agent with every VM running and nothing happening: its memory, and its CPU
	// over a fixed window (the window is the measurement, not a wait for a condition).
	idleRSS, idleTree, idleCPU := processMemory(b, agents[0], "VmRSS"), withChildren(b, agents[0]), cpuTime(b, agents[0])
	printAgentMemory(b, source, fmt.Sprintf("%d VMs", vms))
	time.Sleep(agentIdleWindow)
	idleCPU = cpuTime(b, agents[0]) - idleCPU

	calls := map[string]float64{}
	var drainCPU [2]time.Duration
	var drained time.Duration
	for b.Loop() {
		before := apiRequests(b, metrics)
		cpu0 := [2]time.Duration{cpuTime(b, agents[0]), cpuTime(b, agents[1])}
		t0 := time.Now()
		marked := markForDrain(b, ns, vmis)
		err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 15*time.Minute, true, func(context.Context) (bool, error) {
			moved, succeeded := w.count()
			return moved == vms && succeeded == vms, nil
		})
		if err != nil {
			moved, succeeded := w.count()
			b.Fatalf("within 15 minutes %d of %d VMs left %s and %d migrations succeeded", moved, vms, source.Name(), succeeded)
		}
		drained += time.Since(t0)
		for i, pid := range agents {
			drainCPU[i] += cpuTime(b, pid) - cpu0[i]
		}
		addCalls(calls, before, apiRequests(b, metrics))
		ends, failedCall := libvirtEnds(b, source.agent.LogPath())
		w.report(b, marked, ends, failedCall, w.targetStarts(b, target, marked))
	}
	// The benchmark writes the marks itself (as the webhook would): not among these.
	reportAPICalls(b, calls, float64(b.N*vms), "evacuation")
	mib := func(bytes uint64) float64 { return float64(bytes) / (1 << 20) }
	b.ReportMetric(mib(noVMRSS), "agent-no-vm-rss-MiB")
	b.ReportMetric(mib(idleRSS), "agent-idle-rss-MiB")
	// With its libvirt-client children (one per launcher): what the agent's container holds.
	b.ReportMetric(noVMTree, "agent-no-vm-with-children-MiB")
	b.ReportMetric(idleTree, "agent-idle-with-children-MiB")
	b.ReportMetric(100*idleCPU.Seconds()/agentIdleWindow.Seconds(), "agent-idle-cpu-%")
	// VmHWM: the most either agent held at once in its life, the drain included.
	b.ReportMetric(mib(max(processMemory(b, agents[0], "VmHWM"), processMemory(b, agents[1], "VmHWM"))), "agent-peak-rss-MiB")
	b.ReportMetric(100*drainCPU[0].Seconds()/drained.Seconds(), "source-agent-drain-cpu-%")
	b.ReportMetric(100*drainCPU[1].Seconds()/drained.Seconds(), "target-agent-drain-cpu-%")
}

// withChildren is the resident memory, in MiB, of process pid with every process under it (the
// agent's libvirt-client children): its own RSS and what each descendant holds alone (USS), as
// the descendants share the rest with it. PSS would also split the binary's pages with the other
// node's agent, which on this machine maps the same file.
func withChildren(b testing.TB, pid int) float64 {
	b.Helper()
	total := processMem(b, pid).rss
	var add func(pid int)
	add = func(pid int) {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range tasks {
			children, err := os.ReadFile(t)
			if err != nil {
				continue // the thread ended
			}
			for _, c := range strings.Fields(string(children)) {
				child, err := strconv.Atoi(c)
				if err != nil {
					b.Fatalf("%s: %v", t, err)
				}
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", child)); err != nil {
					continue // it ended
				}
				total += processMem(b, child).uss
				add(child)
			}
		}
	}
	add(pid)
	return total
}

// printAgentMemory waits until n's agent serves its metrics (it has started) and prints where
// its resident memory is: Go's heap and stacks (from its own runtime metrics), anonymous memory
// in all, and its largest mappings (the binary's code, libvirt's C libraries and their data),
// from /proc/<pid>/smaps.
func printAgentMemory(b *testing.B, n *testNode, when string) {
	b.Helper()
	pid := n.agent.Pid()
	// A just-started agent serves its metrics once its caches have synced.
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return metricValue(b, n.metrics, "go_goroutines") >= 0, nil
	})
	if err != nil {
		b.Fatalf("the agent of %s serves no metrics at %s", n.Name(), n.metrics)
	}
	mibOf := func(sample string) float64 { return metricValue(b, n.metrics, sample) / (1 << 20) }
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	byName := map[string]int64{}
	var name string
	var rss, anon int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) >= 5 && strings.Contains(fields[0], "-") {
			name = "[anonymous]"
			if len(fields) >= 6 {
				name = filepath.Base(fields[5])
			}
			continue
		}
		if kb, ok := smapsKiB(line, "Rss:"); ok {
			byName[name] += kb
			rss += kb
		}
		if kb, ok := smapsKiB(line, "Anonymous:"); ok {
			anon += kb
		}
	}
	names := slices.SortedFunc(maps.Keys(byName), func(a, b string) int { return cmp.Compare(byName[b], byName[a]) })
	var top []string
	for _, n := range names[:min(6, len(names))] {
		top = append(top, fmt.Sprintf("%s %.1f", n, mib(byName[n])))
	}
	fmt.Fprintf(os.Stderr, "agent with %s: RSS %.1f MiB, anonymous %.1f (Go heap in use %.1f, stacks %.1f); largest mappings, MiB: %s; %.0f goroutines\n",
		when, mib(rss), mib(anon), mibOf("go_memstats_heap_inuse_bytes"), mibOf("go_memstats_stack_inuse_bytes"),
		strings.Join(top, ", "), metricValue(b, n.metrics, "go_goroutines"))
}

// cordon marks a node (un)schedulable, as kubectl cordon does.
func cordon(b testing.TB, name string, unschedulable bool) {
	b.Helper()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := cluster.Kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Unschedulable = unschedulable
		_, err = cluster.Kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		b.Fatalf("cordon %s = %v: %v", name, unschedulable, err)
	}
}

func deleteNamespace(b testing.TB, ns string) {
	if err := cluster.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}); err != nil {
		b.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		b.Errorf("namespace %s is still there 3 minutes after its deletion", ns)
	}
}

// markForDrain marks every VMI for evacuation from its node with cause Drain, all at once,
// and returns when each mark was written.
func markForDrain(b testing.TB, ns string, vmis []*v1alpha1.VirtualMachineInstance) map[string]time.Time {
	b.Helper()
	var mu sync.Mutex
	marked := map[string]time.Time{}
	errs := make(chan error, len(vmis))
	for _, v := range vmis {
		go func() {
			errs <- retry.RetryOnConflict(retry.DefaultBackoff, func() error {
				cur, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), v.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				cur.Status.EvacuationNodeName = cur.Status.NodeName
				meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue,
					Reason: string(v1alpha1.MigrationCauseDrain), Message: "drain benchmark"})
				if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
					return err
				}
				mu.Lock()
				marked[v.Name] = time.Now()
				mu.Unlock()
				return nil
			})
		}()
	}
	for range vmis {
		if err := <-errs; err != nil {
			b.Fatalf("marking a VMI: %v", err)
		}
	}
	return marked
}

// drainWatch notes when the watches first see each step of each migration attempt.
type drainWatch struct {
	ns       string
	source   string
	mu       sync.Mutex
	attempts map[string]*drainAttempt // by migration name
	vmim     map[string]time.Time     // by VMI name: its first migration created
	pods     map[string]time.Time     // by pod name: created
	podUIDs  map[string]types.UID     // by pod name
	vmiUIDs  map[string]types.UID     // by VMI name
	moved    map[string]time.Time     // by VMI name: seen on another node
}

// drainAttempt is one migration of a VM: a retried VM has a failed one before the one that succeeded.
type drainAttempt struct {
	vmi, pod, failure string
	created           time.Time
	phases            map[v1alpha1.VirtualMachineInstanceMigrationPhase]time.Time
	// ahead: the migration was made ahead of a free slot; released is when it was given one.
	ahead    bool
	released time.Time
}

// ended is when the attempt succeeded or failed, and whether it did.
func (a *drainAttempt) ended() (time.Time, bool) {
	for _, p := range []v1alpha1.VirtualMachineInstanceMigrationPhase{v1alpha1.MigrationSucceeded, v1alpha1.MigrationFailed} {
		if t, ok := a.phases[p]; ok {
			return t, true
		}
	}
	return time.Time{}, false
}

// succeeded is the VMI's attempt that succeeded, or nil.
func (w *drainWatch) succeeded(vmi string) *drainAttempt {
	for _, a := range w.attempts {
		if _, ok := a.phases[v1alpha1.MigrationSucceeded]; ok && a.vmi == vmi {
			return a
		}
	}
	return nil
}

func watchDrain(b testing.TB, ns, source string) *drainWatch {
	w := &drainWatch{ns: ns, source: source, attempts: map[string]*drainAttempt{}, vmim: map[string]time.Time{}, pods: map[string]time.Time{},
		podUIDs: map[string]types.UID{}, vmiUIDs: map[string]types.UID{}, moved: map[string]time.Time{}}
	lb := lifeboatinformers.NewSharedInformerFactoryWithOptions(cluster.Lifeboat, 0, lifeboatinformers.WithNamespace(ns))
	kube := informers.NewSharedInformerFactoryWithOptions(cluster.Kube, 0, informers.WithNamespace(ns))
	_, _ = lb.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: w.migration, UpdateFunc: func(_, obj any) { w.migration(obj) },
	})
	_, _ = lb.Lifeboat().V1alpha1().VirtualMachineInstances().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: w.vmi, UpdateFunc: func(_, obj any) { w.vmi(obj) },
	})
	_, _ = kube.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: w.pod})
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	lb.Start(ctx.Done())
	kube.Start(ctx.Done())
	lb.WaitForCacheSync(ctx.Done())
	kube.WaitForCacheSync(ctx.Done())
	return w
}

func (w *drainWatch) migration(obj any) {
	now := time.Now()
	m := obj.(*v1alpha1.VirtualMachineInstanceMigration)
	vmi := m.Spec.VMIName
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.attempts[m.Name]
	if !ok {
		a = &drainAttempt{vmi: vmi, created: now, phases: map[v1alpha1.VirtualMachineInstanceMigrationPhase]time.Time{}}
		w.attempts[m.Name] = a
		if _, ok := w.vmim[vmi]; !ok {
			w.vmim[vmi] = now
		}
	}
	if _, ok := a.phases[m.Status.Phase]; !ok {
		a.phases[m.Status.Phase] = now
	}
	if m.Status.Phase == v1alpha1.MigrationFailed {
		a.failure = m.Status.FailureReason
	}
	if m.WaitingForSlot() {
		a.ahead = true
	} else if a.ahead && a.released.IsZero() && m.Status.Evacuation != nil {
		a.released = now
	}
	if m.Status.TargetPod != "" {
		a.pod = m.Status.TargetPod
	}
}

func (w *drainWatch) vmi(obj any) {
	now := time.Now()
	v := obj.(*v1alpha1.VirtualMachineInstance)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.vmiUIDs[v.Name] = v.UID
	if _, ok := w.moved[v.Name]; !ok && v.Status.NodeName != "" && v.Status.NodeName != w.source {
		w.moved[v.Name] = now
	}
}

func (w *drainWatch) pod(obj any) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	p := obj.(*corev1.Pod)
	w.pods[p.Name], w.podUIDs[p.Name] = now, p.UID
}

// count is how many VMIs were seen on another node and how many migrations succeeded.
func (w *drainWatch) count() (moved, succeeded int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.attempts {
		if _, ok := a.phases[v1alpha1.MigrationSucceeded]; ok {
			succeeded++
		}
	}
	return len(w.moved), succeeded
}

// readLog is the whole of the log at path.
func readLog(b testing.TB, path string) string {
	b.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return string(text)
}

// libvirtEnds reads from the source agent's log when libvirt's migration of each VMI last ended,
// and which of those calls returned an error. A call can fail and its migration still succeed
// (the reply lost as the source's libvirtd exits, which the agent then tells from the guest's
// state); the attempt's phase says which, so an error here is counted, not skipped.
func libvirtEnds(b testing.TB, agentLog string) (ends map[string]time.Time, failedCall map[string]bool) {
	ends, failedCall = map[string]time.Time{}, map[string]bool{}
	eachLogLine(strings.NewReader(readLog(b, agentLog)), func(line jsonLogLine) {
		if line.Msg == "libvirt migration ended" {
			ends[line.VMI], failedCall[line.VMI] = line.Time, line.Err != nil
		}
	})
	return ends, failedCall
}

// targetStart is when each step of a target launcher's start happened, from the target agent's
// log and the launcher's own: the agent linked the pod's run volume, the launcher started, it
// connected to the agent's notify socket, its libvirtd loaded QEMU's capabilities, and the agent
// connected to that libvirtd (what TargetReady waits for).
type targetStart struct {
	linked, started, notifying, capsLoaded, agentConnected time.Time
	// probed: the agent's copy of the capabilities did not come in time and the launcher probed QEMU.
	probed bool
}

// targetStarts reads, for each VMI's successful migration, its target launcher's start from the
// target node's logs.
func (w *drainWatch) targetStarts(b testing.TB, target *testNode, marked map[string]time.Time) map[string]targetStart {
	b.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	// The agent's log, read once: when it linked each pod's run volume, and when it connected to
	// each VMI's launchers.
	linked, connected := map[string]time.Time{}, map[string][]time.Time{}
	eachLogLine(strings.NewReader(readLog(b, target.agent.LogPath())), func(line jsonLogLine) {
		switch line.Msg {
		case "linked the launcher pod's run volume":
			if _, ok := linked[line.PodUID]; !ok {
				linked[line.PodUID] = line.Time
			}
		case "connected to launcher":
			connected[line.VMIUID] = append(connected[line.VMIUID], line.Time)
		}
	})
	starts := map[string]targetStart{}
	for vmi := range marked {
		a := w.succeeded(vmi)
		if a == nil {
			continue
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: a.pod, UID: w.podUIDs[a.pod]}}
		s := targetStart{linked: linked[string(pod.UID)]}
		if !s.linked.IsZero() {
			// The first connection to the target launcher, after its directory was linked.
			for _, t := range connected[string(w.vmiUIDs[vmi])] {
				if !t.Before(s.linked) {
					s.agentConnected = t
					break
				}
			}
		}
		text, err := target.ContainerLog(pod, launcher.ContainerName)
		if err != nil {
			b.Fatal(err)
		}
		eachLogLine(strings.NewReader(text), func(line jsonLogLine) {
			switch {
			case line.Msg == "launcher started" && s.started.IsZero():
				s.started = line.Time
			case line.Msg == "connected to the agent" && s.notifying.IsZero():
				s.notifying = line.Time
			case line.Msg == "QEMU capabilities loaded" && s.capsLoaded.IsZero():
				s.capsLoaded, s.probed = line.Time, !line.FromAgent
			}
		})
		starts[vmi] = s
	}
	return starts
}

// report computes the drain's figures and reports them as the benchmark's metrics.
func (w *drainWatch) report(b *testing.B, marked, libvirtEnd map[string]time.Time, failedCall map[string]bool, starts map[string]targetStart) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reportAttempts(b, len(marked))
	first := slices.MinFunc(mapValues(marked), time.Time.Compare)
	var last time.Time
	// Each VM's stages are those of its attempt that succeeded; retries are reported apart.
	var migration, markToVMIM, vmimToPod, podToReady, readyToRunning, endToVMI []time.Duration
	var failedCalls []string
	for vmi := range marked {
		a := w.succeeded(vmi)
		if a == nil {
			b.Fatalf("no migration of %s succeeded", vmi)
		}
		ph := a.phases
		end, ok := libvirtEnd[vmi]
		if !ok {
			b.Fatalf("the source agent's log says nothing of the end of %s's migration", vmi)
		}
		if failedCall[vmi] {
			failedCalls = append(failedCalls, vmi)
		}
		if w.moved[vmi].After(last) {
			last = w.moved[vmi]
		}
		migration = append(migration, end.Sub(ph[v1alpha1.MigrationRunning]))
		vmimToPod = append(vmimToPod, w.pods[a.pod].Sub(a.created))
		podToReady = append(podToReady, ph[v1alpha1.MigrationTargetReady].Sub(w.pods[a.pod]))
		readyToRunning = append(readyToRunning, ph[v1alpha1.MigrationRunning].Sub(ph[v1alpha1.MigrationTargetReady]))
		endToVMI = append(endToVMI, w.moved[vmi].Sub(end))
	}
	markToVMIM = w.queueFree(marked, libvirtEnd)
	slotIdle := w.slotIdle(marked, libvirtEnd)
	var sum time.Duration
	for _, d := range migration {
		sum += d
	}
	all, ideal := last.Sub(first), sum/drainParallel
	b.ReportMetric(all.Seconds(), "s/drain")
	b.ReportMetric(ideal.Seconds(), "s-ideal/drain")
	b.ReportMetric(all.Seconds()/ideal.Seconds(), "drain/ideal")
	// Migrations that succeeded though libvirt's call returned an error: each waited for the
	// agent to learn where the guest went.
	b.ReportMetric(float64(len(failedCalls)), "failed-calls/drain")
	// Migrations made ahead that their source agent started as the transfer they followed ended,
	// before the controller's release of their slot was seen.
	followers := 0
	for vmi := range marked {
		a := w.succeeded(vmi)
		if a.ahead && (a.released.IsZero() || a.phases[v1alpha1.MigrationRunning].Before(a.released)) {
			followers++
		}
	}
	b.ReportMetric(float64(followers), "agent-started/drain")
	if len(failedCalls) > 0 {
		slices.Sort(failedCalls)
		fmt.Printf("drain: libvirt's call returned an error, the migration succeeded: %s\n", strings.Join(failedCalls, ", "))
	}
	stages := []struct {
		unit string
		d    []time.Duration
	}{
		{"ms-mark-or-free-slot-to-vmim", markToVMIM}, {"ms-vmim-to-pod", vmimToPod}, {"ms-pod-to-targetready", podToReady},
		{"ms-targetready-to-running", readyToRunning}, {"ms-libvirt-end-to-vmi", endToVMI}, {"ms-migration", migration},
		{"ms-mark-or-free-slot-to-running", slotIdle},
	}
	// Printed rather than logged: the node harness's logs would crowd these out of the
	// benchmark's truncated log.
	for _, s := range stages {
		b.ReportMetric(float64(medianDuration(s.d).Milliseconds()), s.unit)
		fmt.Printf("drain: %s: median %s, min %s, max %s\n", s.unit, medianDuration(s.d), slices.Min(s.d), slices.Max(s.d))
	}
	fmt.Printf("drain: all %d VMs left in %s; sum of migrations %s / %d = %s\n", len(marked), all.Round(time.Millisecond), sum.Round(time.Millisecond), drainParallel, ideal.Round(time.Millisecond))
	w.printTargetStarts(starts)
	w.printTimeline(first, libvirtEnd, starts)
	if dir := chart.Dir(); dir != "" {
		// Drawn after every run: the file holds the last run's.
		name := fmt.Sprintf("drain-%dvms.svg", len(marked))
		if err := chart.WriteFile(dir, name, func(out io.Writer) error { return w.drawTimeline(out, first, marked, libvirtEnd) }); err != nil {
			b.Fatal(err)
		}
	}
}

// drawTimeline draws each VM's stages in seconds since the first mark, in the order their
// migrations were created.
func (w *drainWatch) drawTimeline(out io.Writer, first time.Time, marked, libvirtEnd map[string]time.Time) error {
	vmis := slices.SortedFunc(maps.Keys(w.vmim), func(a, b string) int { return w.vmim[a].Compare(w.vmim[b]) })
	var vms []chart.DrainVM
	for _, v := range vmis {
		a := w.succeeded(v)
		ph := a.phases
		steps := []struct {
			name string
			from time.Time
			to   time.Time
		}{
			{"marked, waiting for a slot", marked[v], a.created},
			{"migration created → target pod", a.created, w.pods[a.pod]},
			{"target pod → TargetReady", w.pods[a.pod], ph[v1alpha1.MigrationTargetReady]},
			{"TargetReady → Running", ph[v1alpha1.MigrationTargetReady], ph[v1alpha1.MigrationRunning]},
			{"libvirt migrating", ph[v1alpha1.MigrationRunning], libvirtEnd[v]},
			{"libvirt's end → VMI on the target", libvirtEnd[v], w.moved[v]},
		}
		vm := chart.DrainVM{VMI: v}
		for _, s := range steps {
			vm.Stages = append(vm.Stages, chart.Stage{Name: s.name, Start: s.from.Sub(first), End: s.to.Sub(first)})
		}
		vms = append(vms, vm)
	}
	return chart.Drain(out, fmt.Sprintf("A drain of %d VMs from one node, each VM's stages", len(marked)), vms)
}

// reportAttempts reports the migration attempts on their own: how many, how many were retries
// (attempts beyond one per VM), and how long an attempt took from its creation to its end.
func (w *drainWatch) reportAttempts(b *testing.B, vms int) {
	var took []time.Duration
	var failed []string
	for name, a := range w.attempts {
		end, ok := a.ended()
		if !ok {
			continue
		}
		took = append(took, end.Sub(a.created))
		if a.failure != "" {
			failed = append(failed, fmt.Sprintf("%s (%s) after %s", name, a.failure, end.Sub(a.created).Round(time.Millisecond)))
		}
	}
	retries := len(w.attempts) - vms
	b.ReportMetric(float64(retries), "retries/drain")
	fmt.Printf("drain: attempts %d for %d VMs, %d retried; time per attempt median %s, max %s\n",
		len(w.attempts), vms, retries, medianDuration(took), slices.Max(took))
	slices.Sort(failed)
	for _, f := range failed {
		fmt.Printf("drain: failed attempt %s\n", f)
	}
}

// printTargetStarts prints the median, least and most of each step of the target launchers' starts,
// from the target pod's creation to TargetReady.
func (w *drainWatch) printTargetStarts(starts map[string]targetStart) {
	steps := []struct {
		name     string
		from, to func(vmi string, s targetStart) time.Time
	}{
		{"target pod → run volume linked", func(vmi string, _ targetStart) time.Time { return w.pods[w.succeeded(vmi).pod] }, func(_ string, s targetStart) time.Time { return s.linked }},
		{"linked → launcher started", func(_ string, s targetStart) time.Time { return s.linked }, func(_ string, s targetStart) time.Time { return s.started }},
		{"launcher started → connected to the agent", func(_ string, s targetStart) time.Time { return s.started }, func(_ string, s targetStart) time.Time { return s.notifying }},
		{"launcher started → QEMU capabilities loaded", func(_ string, s targetStart) time.Time { return s.started }, func(_ string, s targetStart) time.Time { return s.capsLoaded }},
		{"capabilities loaded → agent connected", func(_ string, s targetStart) time.Time { return s.capsLoaded }, func(_ string, s targetStart) time.Time { return s.agentConnected }},
		{"agent connected → TargetReady", func(_ string, s targetStart) time.Time { return s.agentConnected }, func(vmi string, _ targetStart) time.Time {
			return w.succeeded(vmi).phases[v1alpha1.MigrationTargetReady]
		}},
	}
	probed := 0
	for _, s := range starts {
		if s.probed {
			probed++
		}
	}
	for _, step := range steps {
		var d []time.Duration
		for vmi, s := range starts {
			from, to := step.from(vmi, s), step.to(vmi, s)
			if !from.IsZero() && !to.IsZero() {
				d = append(d, to.Sub(from))
			}
		}
		if len(d) == 0 {
			fmt.Printf("drain: target start: %s: not in the logs\n", step.name)
			continue
		}
		fmt.Printf("drain: target start: %s: median %s, min %s, max %s (%d targets)\n", step.name,
			medianDuration(d).Round(time.Millisecond), slices.Min(d).Round(time.Millisecond), slices.Max(d).Round(time.Millisecond), len(d))
	}
	fmt.Printf("drain: target start: %d of %d launchers probed QEMU themselves (the agent's capabilities did not come in time)\n", probed, len(starts))
}

// printTimeline prints each VM's steps in seconds since the first mark, in the order their
// migrations were created: its target's start between its pod and TargetReady.
func (w *drainWatch) printTimeline(first time.Time, libvirtEnd map[string]time.Time, starts map[string]targetStart) {
	vmis := slices.SortedFunc(maps.Keys(w.vmim), func(a, b string) int { return w.vmim[a].Compare(w.vmim[b]) })
	at := func(t time.Time) string {
		if t.IsZero() {
			return "     -"
		}
		return fmt.Sprintf("%6.3f", t.Sub(first).Seconds())
	}
	fmt.Println("drain: vmi       vmim  t-pod linked l-start l-caps a-conn  ready   slot running libvirt-end  moved succeeded")
	for _, v := range vmis {
		a := w.succeeded(v)
		ph := a.phases
		slot := "     -" // made with its slot
		if a.ahead {
			slot = at(a.released)
		}
		s := starts[v]
		fmt.Printf("drain: %-8s %s %s %s  %s %s %s %s %s %s %s %s %s\n", v, at(a.created), at(w.pods[a.pod]), at(s.linked), at(s.started), at(s.capsLoaded), at(s.agentConnected),
			at(ph[v1alpha1.MigrationTargetReady]), slot, at(ph[v1alpha1.MigrationRunning]), at(libvirtEnd[v]), at(w.moved[v]), at(ph[v1alpha1.MigrationSucceeded]))
	}
}

// slotIdle is, for each migration in the order they started moving memory, how long its slot
// stood idle: from the mark for the first drainParallel, from the end of the transfer whose slot
// it took for the others (libvirt's end in the source agent's log: a migration following it
// starts then), to its phase Running. A migration made ahead of a free slot (its VMIM and
// target earlier) counts from the slot, as one made then does.
func (w *drainWatch) slotIdle(marked, libvirtEnd map[string]time.Time) []time.Duration {
	var running, freed []time.Time
	first := slices.MinFunc(mapValues(marked), time.Time.Compare)
	for vmi := range marked {
		a := w.succeeded(vmi)
		running = append(running, a.phases[v1alpha1.MigrationRunning])
		freed = append(freed, libvirtEnd[vmi])
	}
	slices.SortFunc(running, time.Time.Compare)
	slices.SortFunc(freed, time.Time.Compare)
	out := make([]time.Duration, len(running))
	for i, r := range running {
		from := first
		if i >= drainParallel {
			from = freed[i-drainParallel]
		}
		out[i] = r.Sub(from)
	}
	return out
}

// queueFree is, for each migration, the time from when it could be made to when it was: from
// the mark for the first drainParallel, from the end of the transfer whose slot it took for the
// others, which wait in the evacuation controller's queue; negative for a migration made ahead
// of its slot.
func (w *drainWatch) queueFree(marked, libvirtEnd map[string]time.Time) []time.Duration {
	type created struct {
		vmi string
		at  time.Time
	}
	var order []created
	var freed []time.Time
	for vmi := range marked {
		order = append(order, created{vmi, w.vmim[vmi]})
		freed = append(freed, libvirtEnd[vmi])
	}
	slices.SortFunc(order, func(a, b created) int { return a.at.Compare(b.at) })
	slices.SortFunc(freed, time.Time.Compare)
	out := make([]time.Duration, len(order))
	for i, c := range order {
		if i < drainParallel {
			out[i] = c.at.Sub(marked[c.vmi])
			continue
		}
		out[i] = c.at.Sub(freed[i-drainParallel])
	}
	return out
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func medianDuration(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
