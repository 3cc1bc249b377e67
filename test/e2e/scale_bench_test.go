package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/hollow"
)

// The cluster BenchmarkClusterScale builds (issue 22 asks for 1,000 VMIs on 100 nodes), and how
// long it watches the cluster idle.
var (
	scaleVMIs  = flag.Int("scale-vmis", 1000, "VMIs created by BenchmarkClusterScale")
	scaleNodes = flag.Int("scale-nodes", 100, "hollow nodes of BenchmarkClusterScale")
	scaleIdle  = flag.Duration("scale-idle", 2*time.Minute, "how long BenchmarkClusterScale counts the calls of the idle cluster")
)

// The starts' calls are counted until lifeboat has made no write for settleQuiet (its
// recorder sends queued Events after the last VMI runs), at most settleBound after. Its
// periodic writes are further apart: the webhook configuration's check, every 2 minutes.
const (
	settleQuiet = 10 * time.Second
	settleBound = 5 * time.Minute
)

// BenchmarkClusterScale is what lifeboat costs the cluster side as VMIs grow (issue 22, item 4):
// -scale-vmis VMIs on -scale-nodes hollow nodes (package hollow: Node objects with renewed
// leases, and stand-ins for the kubelet and the agent that report pods and guests running at
// once), with the real API server, scheduler, controller manager and lifeboat-controller. Each
// run reports:
//   - creation to Running of every VMI, created startupInterval apart (KubeVirt's density
//     method), against the same number of ordinary pods on the same nodes just before;
//   - lifeboat-controller's resident memory with them all running, and its CPU time per VMI start;
//   - the controller's API calls per VMI start (until its writes settle, and how long after
//     the last VMI ran its last write came), per hour of the idle cluster (over -scale-idle,
//     from then), and per evacuation of a drain, counted client-side by verb and resource (the
//     breakdown is on stderr); the stand-ins' calls are not counted, since they are not lifeboat's;
//   - the drain of the node with the most VMIs (cordon, then one eviction per launcher pod, as
//     kubectl drain): the time until every evacuation has started, that is until each VM's
//     migration has its target pod running on another node and is handed to the agents
//     (PreparingTarget). The parallel-migration limits let all of the node's VMs go at once, so
//     this is the controller's own latency, not the limits'.
func BenchmarkClusterScale(b *testing.B) {
	ctx := context.Background()
	count := *scaleVMIs
	setConfig(b, false, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.ParallelMigrationsPerCluster = ptr.To(int32(count))
		c.Spec.Migrations.ParallelOutboundMigrationsPerNode = ptr.To(int32(count))
	})
	controller := startControllerWithWebhook(b)
	nodes, err := hollow.Start(ctx, cluster.Kube, cluster.Lifeboat, "hollow", *scaleNodes, nil)
	if err != nil {
		b.Fatal(err)
	}
	// After the namespaces' deletions (registered later, so run earlier): their pods need the
	// hollow kubelet to go.
	b.Cleanup(func() { nodes.Stop(context.Background()) })
	metrics := []string{controller.metrics}
	pid := controller.Pid()

	var pods, vmis, drains, settles []time.Duration
	var rss []float64 // MiB
	var startCPU time.Duration
	start, evacuation, idle := map[string]float64{}, map[string]float64{}, map[string]float64{}
	var evacuated int
	var idleHours float64
	for b.Loop() {
		ns := testNamespace(b)
		pods = append(pods, createToRunning(b, count, podsIn(ns), func(ctx context.Context, i int) (string, error) {
			p, err := cluster.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i)},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeSelector: map[string]string{hollow.Label: "true"},
					Containers: []corev1.Container{{Name: "c", Image: "none"}}},
			}, metav1.CreateOptions{})
			if err != nil {
				return "", err
			}
			return p.Name, nil
		}, func(obj any) (string, bool) {
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return "", false
			}
			return p.Name, p.Status.Phase == corev1.PodRunning
		})...)

		before, cpu0 := apiRequests(b, metrics), cpuTime(b, pid)
		vmis = append(vmis, createToRunning(b, count, vmisIn(ns), func(ctx context.Context, i int) (string, error) {
			v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx,
				newVMI(fmt.Sprintf("vmi-%d", i), strategy(v1alpha1.EvictionStrategyLiveMigrate)), metav1.CreateOptions{})
			if err != nil {
				return "", err
			}
			return v.Name, nil
		}, func(obj any) (string, bool) {
			v, ok := obj.(*v1alpha1.VirtualMachineInstance)
			if !ok {
				return "", false
			}
			return v.Name, running(v)
		})...)
		// The starts' calls include what the controller still sends once every VMI runs.
		after, settle := settledCalls(b, metrics, settleQuiet, settleBound)
		settles = append(settles, settle)
		startCPU += cpuTime(b, pid) - cpu0
		addCalls(start, before, after)
		rss = append(rss, float64(processMemory(b, pid, "VmRSS"))/(1<<20))

		idleCalls(b, metrics, *scaleIdle, idle)
		idleHours += scaleIdle.Hours()

		before = apiRequests(b, metrics)
		took, n := drainHollowNode(b, ns)
		drains = append(drains, took)
		evacuated += n
		addCalls(evacuation, before, apiRequests(b, metrics))
		deleteNamespace(b, ns)
	}
	fmt.Fprintf(os.Stderr, "%d pods and %d VMIs on %d hollow nodes, created %s apart; %d VMs evacuated in %d drains\n",
		len(pods), len(vmis), *scaleNodes, startupInterval, evacuated, len(drains))
	b.ReportMetric(percentile(pods, 50).Seconds(), "pod-p50-s")
	b.ReportMetric(percentile(pods, 95).Seconds(), "pod-p95-s")
	b.ReportMetric(percentile(vmis, 50).Seconds(), "vmi-p50-s")
	b.ReportMetric(percentile(vmis, 95).Seconds(), "vmi-p95-s")
	b.ReportMetric(percentile(vmis, 50).Seconds()/percentile(pods, 50).Seconds(), "vmi/pod-p50")
	b.ReportMetric(median(rss), "controller-rss-MiB")
	b.ReportMetric(float64(startCPU.Milliseconds())/float64(len(vmis)), "controller-cpu-ms/vmi")
	b.ReportMetric(percentile(drains, 50).Seconds(), "drain-to-started-s")
	b.ReportMetric(percentile(settles, 50).Seconds(), "writes-after-running-s")
	reportAPICalls(b, start, float64(len(vmis)), "vmi")
	reportAPICalls(b, evacuation, float64(evacuated), "evacuation")
	reportAPICalls(b, idle, idleHours, "hour")
}

// drainHollowNode drains the hollow node with the most of ns's VMIs as kubectl drain does
// (cordon, then an eviction of each launcher pod at once; the webhook answers each with 429 and
// marks the VM) and returns the time from the cordon until every one of those VMs has a
// migration in PreparingTarget, and how many VMs that was. The node is uncordoned afterwards.
func drainHollowNode(b *testing.B, ns string) (time.Duration, int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	all, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	byNode := map[string][]string{}
	var node string
	for _, v := range all.Items {
		byNode[v.Status.NodeName] = append(byNode[v.Status.NodeName], v.Name)
		if len(byNode[v.Status.NodeName]) > len(byNode[node]) {
			node = v.Status.NodeName
		}
	}
	want := map[string]bool{}
	for _, name := range byNode[node] {
		want[name] = true
	}
	w, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()

	t0 := time.Now()
	cordon(b, node, true)
	defer cordon(b, node, false)
	pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pods.Items))
	for i, p := range pods.Items {
		wg.Go(func() {
			err := cluster.Kube.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns}})
			if s := (apierrors.APIStatus)(nil); !errors.As(err, &s) || s.Status().Code != 429 || !strings.Contains(s.Status().Message, webhook.EvacuationText) {
				errs[i] = fmt.Errorf("evicting %s: want 429 with %q, got %v", p.Name, webhook.EvacuationText, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	started := map[string]bool{}
	for len(started) < len(want) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the migrations' watch ended with %d of %d evacuations from %s started", len(started), len(want), node)
			}
			if m, ok := ev.Object.(*v1alpha1.VirtualMachineInstanceMigration); ok && want[m.Spec.VMIName] && m.Status.Phase == v1alpha1.MigrationPreparingTarget {
				started[m.Spec.VMIName] = true
			}
		case <-ctx.Done():
			b.Fatalf("%d of %d evacuations from %s started (migration in PreparingTarget) within 5 minutes", len(started), len(want), node)
		}
	}
	return time.Since(t0), len(want)
}

// processMemory is a memory figure of process pid from /proc/pid/status (VmRSS, VmHWM), in bytes.
func processMemory(b *testing.B, pid int, field string) uint64 {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == field+":" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// cpuTime is the CPU time process pid has used, user and system (/proc/pid/stat's utime and
// stime, in the kernel's USER_HZ of 100 ticks a second).
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name, in parentheses, may hold spaces: fields count from after it.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		b.Fatal(err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
