package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// startupVMIs is how many VMIs (and, for the baseline, ordinary pods) BenchmarkCreationToRunning
// creates: KubeVirt's density suite uses 100. Each real TCG guest holds about 230 MiB of the
// machine (guest pages it touched and its pod's overhead; 40 held 9.1 GiB): pass -startup-vmis=N
// after -args where 100 of them do not fit (make bench-startup passes STARTUP_VMIS).
var startupVMIs = flag.Int("startup-vmis", 100, "VMIs created by BenchmarkCreationToRunning")

// startupAccel is the launchers' acceleration in BenchmarkCreationToRunning: tcg, or kvm where
// /dev/kvm opens. A VMI counts as Running once its domain runs, whether or not its Linux has
// booted. On a KVM host guests boot in a fraction of TCG's CPU time, so the figure is more
// lifeboat's path and less the machine's CPU; under this machine's nested KVM the guests spin in
// their kernel's decompressor instead (docs/benchmarks.md, "VMI start-up").
var startupAccel = flag.String("startup-accel", "tcg", "acceleration of BenchmarkCreationToRunning's launchers: tcg or kvm")

const (
	startupInterval = 100 * time.Millisecond
	startupMemory   = "128Mi"
)

// BenchmarkCreationToRunning is KubeVirt's density method (issue 22): -startup-vmis minimal VMIs
// created startupInterval apart on two emulated nodes, and the time from each create call to the
// watch event that shows it Running (its guest's domain runs; the agent's write), client-side at
// millisecond resolution (creation timestamps have whole seconds). The baseline, in the same run
// on the same nodes and just before, is as many ordinary pods created the same way, to the watch
// event showing them Running. It reports p50 and p95 of each and the p50 ratio. Under TCG on a
// small machine the VMIs' figure includes their launchers and QEMUs waiting for CPU behind the
// guests already booting.
func BenchmarkCreationToRunning(b *testing.B) {
	count := *startupVMIs
	request := vmi.MemoryRequest(resource.MustParse(startupMemory), 1)
	// Room for every VMI on either node, so the scheduler's spreading decides, not capacity.
	capacity := resource.NewQuantity(int64(count)*request.Value()+(2<<30), resource.BinarySI)
	withAccel := func(*node.Config) {}
	switch *startupAccel {
	case "kvm":
		withAccel = withKVM(b)
	case "tcg":
	default:
		b.Fatalf("-startup-accel=%q: want tcg or kvm", *startupAccel)
	}
	setConfig(b, false)
	_, controllerMetrics := startControllerWithMetrics(b, "--acceleration", *startupAccel)
	nodes := startNodes(b, 2, withAccel, behindTheControlPlane(), func(c *node.Config) {
		c.Capacity = corev1.ResourceList{corev1.ResourceMemory: *capacity}
		c.Binaries["sleep"] = "/usr/bin/sleep"
	})
	metrics := lifeboatMetrics(controllerMetrics, nodes)
	var pods, vmis []time.Duration
	calls := map[string]float64{} // by component, verb and resource, over every run's VMI starts
	for b.Loop() {
		ns := testNamespace(b)
		pods = append(pods, createToRunning(b, count, podsIn(ns), func(ctx context.Context, i int) (string, error) {
			p, err := cluster.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i)},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
					Name: "sleep", Image: "none", Command: []string{"sleep", "3600"},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("16Mi")}},
				}}},
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
		before := apiRequests(b, metrics)
		vmis = append(vmis, createToRunning(b, count, vmisIn(ns), func(ctx context.Context, i int) (string, error) {
			v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, newVMI(fmt.Sprintf("vmi-%d", i), func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Memory = resource.MustParse(startupMemory)
			}), metav1.CreateOptions{})
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
		addCalls(calls, before, apiRequests(b, metrics))
		deleteNamespace(b, ns)
	}
	fmt.Fprintf(os.Stderr, "%d pods and %d VMIs, created %s apart\n", len(pods), len(vmis), startupInterval)
	b.ReportMetric(percentile(pods, 50).Seconds(), "pod-p50-s")
	b.ReportMetric(percentile(pods, 95).Seconds(), "pod-p95-s")
	b.ReportMetric(percentile(vmis, 50).Seconds(), "vmi-p50-s")
	b.ReportMetric(percentile(vmis, 95).Seconds(), "vmi-p95-s")
	b.ReportMetric(percentile(vmis, 50).Seconds()/percentile(pods, 50).Seconds(), "vmi/pod-p50")
	reportAPICalls(b, calls, float64(len(vmis)), "vmi")
}

// watched is what an informer needs of one kind of object: how to list and watch them, and
// an object of their type.
type watched struct {
	lw  cache.ListerWatcher
	obj runtime.Object
}

// podsIn lists and watches the pods of namespace ns.
func podsIn(ns string) watched {
	pods := cluster.Kube.CoreV1().Pods(ns)
	return watched{listWatch(pods.List, pods.Watch), &corev1.Pod{}}
}

// vmisIn lists and watches the VMIs of namespace ns.
func vmisIn(ns string) watched {
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	return watched{listWatch(vmis.List, vmis.Watch), &v1alpha1.VirtualMachineInstance{}}
}

// listWatch is a typed client's List and Watch as an informer's ListerWatcher.
func listWatch[L runtime.Object](list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return list(ctx, o)
		},
		WatchFuncWithContext: watchFn,
	}
}

// createToRunning creates count objects startupInterval apart with create, and returns for each
// the time from its create call to the first event of what in which isRunning says it runs. The
// events come through an informer, which watches again (and lists, if it must) when a watch
// ends: an API server starved by booting guests times requests out and drops connections.
func createToRunning(b *testing.B, count int, what watched,
	create func(context.Context, int) (string, error), isRunning func(any) (string, bool)) []time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	_, _, w, stopped := watchtools.NewIndexerInformerWatcher(what.lw, what.obj)
	defer func() {
		w.Stop()
		<-stopped
	}()
	var mu sync.Mutex
	created, ran := map[string]time.Time{}, map[string]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var ev watch.Event
			select {
			case ev = <-w.ResultChan():
			case <-ctx.Done():
				return // the informer's channel stays open: ended with the call
			}
			name, ok := isRunning(ev.Object)
			if !ok {
				continue
			}
			mu.Lock()
			if _, seen := ran[name]; !seen {
				ran[name] = time.Now()
			}
			n := len(ran)
			mu.Unlock()
			if n == count {
				return
			}
		}
	}()
	tick := time.NewTicker(startupInterval)
	defer tick.Stop()
	for i := range count {
		start := time.Now()
		name, err := create(ctx, i)
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		created[name] = start
		mu.Unlock()
		<-tick.C
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != count {
		b.Fatalf("%d of %d running within 20 minutes of the first create", len(ran), count)
	}
	var out []time.Duration
	for name, at := range ran {
		out = append(out, at.Sub(created[name]))
	}
	return out
}

// startControllerWithMetrics starts the controller with args, serving its metrics on loopback,
// and returns it and their URL.
func startControllerWithMetrics(t testing.TB, args ...string) (*proc, string) {
	address := fmt.Sprintf("127.0.0.1:%d", freePort(t, "127.0.0.1"))
	return startController(t, append(args, "--metrics-listen", address, "--metrics-insecure")...), "http://" + address + "/metrics"
}

// lifeboatMetrics are the /metrics URLs of the controller (first) and of the nodes' agents.
func lifeboatMetrics(controller string, nodes []*testNode) []string {
	urls := []string{controller}
	for _, n := range nodes {
		urls = append(urls, n.metrics)
	}
	return urls
}

// reportAPICalls prints calls (by component, verb and resource; see apiRequests) per one of n
// stories on stderr, where the nodes' logs do not crowd them out of b.Log's, and reports their
// sums as api-calls/per and api-writes/per.
func reportAPICalls(b *testing.B, calls map[string]float64, n float64, per string) {
	var writes, all float64
	for _, k := range slices.Sorted(maps.Keys(calls)) {
		v := calls[k] / n
		if v == 0 {
			continue
		}
		fmt.Fprintf(os.Stderr, "API calls per %s: %-60s %.2f\n", per, k, v)
		all += v
		if isWrite(k) {
			writes += v
		}
	}
	b.ReportMetric(all, "api-calls/"+per)
	b.ReportMetric(writes, "api-writes/"+per)
}

// apiRequests reads lifeboat_apiserver_requests_total from each /metrics URL (the controller's
// first, then the agents'), summed by component ("controller" or "agent"), verb and resource.
func apiRequests(b testing.TB, urls []string) map[string]float64 {
	b.Helper()
	sample := regexp.MustCompile(`(?m)^lifeboat_apiserver_requests_total\{resource="([^"]*)",verb="([^"]*)"\} (\S+)$`)
	out := map[string]float64{}
	for i, url := range urls {
		component := "agent"
		if i == 0 {
			component = "controller"
		}
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		found := sample.FindAllStringSubmatch(string(body), -1)
		if found == nil {
			b.Fatalf("%s has no lifeboat_apiserver_requests_total", url)
		}
		for _, m := range found {
			v, _ := strconv.ParseFloat(m[3], 64)
			out[component+" "+m[2]+" "+m[1]] += v
		}
	}
	return out
}

// addCalls adds the calls made between two readings of apiRequests, before and after, to into.
func addCalls(into, before, after map[string]float64) {
	for k, v := range after {
		into[k] += v - before[k]
	}
}

// isWrite says whether a key of apiRequests ("component verb resource") counts a write.
func isWrite(key string) bool {
	verb := strings.Fields(key)[1]
	return verb != "get" && verb != "list" && verb != "watch"
}

// writesIn is the number of writes in apiRequests' counters.
func writesIn(calls map[string]float64) float64 {
	var n float64
	for k, v := range calls {
		if isWrite(k) {
			n += v
		}
	}
	return n
}

// settledCalls waits until the components at urls have made no write for quiet, so that what
// the last steps caused is done (a recorder sends its Events after them, later the more it has
// queued), and returns their counters then and how long after the call their last write came.
// It fails b past bound.
func settledCalls(b *testing.B, urls []string, quiet, bound time.Duration) (map[string]float64, time.Duration) {
	b.Helper()
	start := time.Now()
	lastWrite, lastWrites := start, -1.0
	calls := kubewait.For(b, bound, fmt.Sprintf("no API write from lifeboat for %s", quiet),
		func(context.Context) (map[string]float64, error) {
			calls := apiRequests(b, urls)
			if n := writesIn(calls); n != lastWrites {
				lastWrite, lastWrites = time.Now(), n
			}
			return calls, nil
		},
		func(map[string]float64) bool { return time.Since(lastWrite) >= quiet },
		func(calls map[string]float64) string {
			return fmt.Sprintf("%.0f writes, the last %s ago", writesIn(calls), time.Since(lastWrite).Round(time.Second))
		})
	return calls, lastWrite.Sub(start)
}

// idleCalls adds to into the calls the components at urls make over window while nothing is
// asked of them. The window is the measurement (calls counted over a fixed time), not a wait
// for a condition: there is none to wait for.
func idleCalls(b *testing.B, urls []string, window time.Duration, into map[string]float64) {
	b.Helper()
	before := apiRequests(b, urls)
	time.Sleep(window)
	addCalls(into, before, apiRequests(b, urls))
}

// percentile is the p-th percentile of d, nearest rank.
func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// idleWindow is how long BenchmarkIdleAPICalls watches the counters of a quiet cluster.
const idleWindow = 2 * time.Minute

// BenchmarkIdleAPICalls is what running VMs cost the API server while nothing happens to them
// (issue 22: an idle hour should make no writes for its VMs): idleVMs VMs booted on two nodes,
// then the controller's and the agents' calls over idleWindow, reported per hour for the whole
// (the breakdown on stderr tells the VMs' calls from the components' own, such as leases). The
// window is the measurement, not a wait for a condition.
func BenchmarkIdleAPICalls(b *testing.B) {
	const idleVMs = 4
	setConfig(b, false)
	nodes := startNodes(b, 2)
	_, controllerMetrics := startControllerWithMetrics(b)
	metrics := lifeboatMetrics(controllerMetrics, nodes)
	ns := testNamespace(b)
	b.Cleanup(func() { deleteNamespace(b, ns) })
	for i := range idleVMs {
		v := createVMI(b, ns, newVMI(fmt.Sprintf("idle-%d", i)))
		v = waitVMI(b, ns, v.Name, 2*bootTimeout, "phase Running", running)
		waitCounterPast(b, nodeOf(b, nodes, v).consolePath(v), 1, 2*bootTimeout)
	}
	calls := map[string]float64{}
	for b.Loop() {
		idleCalls(b, metrics, idleWindow, calls)
	}
	hours := float64(b.N) * idleWindow.Hours()
	for k := range calls {
		calls[k] /= hours
	}
	reportAPICalls(b, calls, 1, "hour")
}
