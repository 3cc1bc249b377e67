package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	launcherrun "github.com/lifeboat-vm/lifeboat/launcher"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/internal/chart"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// withPodNetwork gives v a card on the pod network with the masquerade binding, forwarding the
// guest's serving port.
func withPodNetwork(v *v1alpha1.VirtualMachineInstance) {
	v.Spec.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{},
		Ports: []v1alpha1.Port{{Name: "counter", Port: protocol.ServePort}}}}
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
}

// askGuest connects to address from the fabric, as a client on a node, and reads the guest's answer.
func askGuest(ctx context.Context, network *node.Network, address string) (boot string, counter int, err error) {
	line, err := network.AskLine(ctx, address, 2*time.Second)
	if err != nil {
		return "", 0, err
	}
	return protocol.ParseAnswer(line)
}

// launcherPodOn is v's launcher pod on node.
func launcherPodOn(t testing.TB, v *v1alpha1.VirtualMachineInstance, node string) *corev1.Pod {
	t.Helper()
	pods, err := cluster.Kube.CoreV1().Pods(v.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID), FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one launcher pod for %s on %s: %v, %d pods", v.Name, node, err, len(pods.Items))
	}
	return &pods.Items[0]
}

// waitGuestAnswer asks address until the guest answers.
func waitGuestAnswer(t testing.TB, network *node.Network, address string, timeout time.Duration) (string, int) {
	t.Helper()
	var boot string
	var counter int
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		boot, counter, last = askGuest(ctx, network, address)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the guest did not answer on %s within %s: %v", address, timeout, last)
	}
	return boot, counter
}

// answer is one request of the client that asks a Service every clientInterval.
type answer struct {
	sent, received time.Time
	boot           string
	counter        int
	// err is the request's last error: a request that failed is tried once more, as a client
	// that retries once would, and firstErr is the first attempt's error then.
	err, firstErr error
	// firstDone is when the first attempt failed.
	firstDone time.Time
}

// clientInterval is how often the client asks: a user's health check, finer than any
// interruption worth reporting.
const clientInterval = 20 * time.Millisecond

// askEvery asks address every clientInterval, each request on its own with a two-second
// timeout and tried once more if it fails, until ctx ends. answered counts the answers received after a time so far; all waits
// for ctx's end and returns every answer and failure in the order they were sent.
func askEvery(ctx context.Context, network *node.Network, address string) (answered func(after time.Time) int, all func() []answer) {
	var mu sync.Mutex
	var answers []answer
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(clientInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-tick.C:
			}
			wg.Go(func() {
				a := answer{sent: time.Now()}
				a.boot, a.counter, a.err = askGuest(context.Background(), network, address)
				if a.err != nil {
					a.firstErr, a.firstDone = a.err, time.Now()
					a.boot, a.counter, a.err = askGuest(context.Background(), network, address)
				}
				a.received = time.Now()
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			})
		}
	}()
	answered = func(after time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range answers {
			if a.err == nil && a.received.After(after) {
				n++
			}
		}
		return n
	}
	return answered, func() []answer {
		<-done
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(answers, func(a, b answer) int { return a.sent.Compare(b.sent) })
		return answers
	}
}

// servedMigration is what a client of a VM's Service saw while the VM was live-migrated.
type servedMigration struct {
	answers []answer
	// sourceAgentLog is the source node's agent's log; sourceAddress the guest's port on the
	// source pod's address; network the fabric the client asks from.
	sourceAgentLog, sourceAddress string
	network                       *node.Network
	// source is the node the guest left and sourcePod its launcher pod there.
	source    *testNode
	sourcePod *corev1.Pod
	// switches watches the namespace's pods and EndpointSlices until the test ends: the source
	// pod may be deleted once it has ended (vmi.StillReadyWithoutGuest), and the watch keeps
	// what it last was.
	switches *switchWatch
	// interruption is the longest time without an answer, from the last answer before it to
	// the first after it: for a migration, from the source's last to the target's first.
	interruption time.Duration
	// downtime is the migration's own, as libvirt measured it (the target launcher logs it).
	downtime time.Duration
	// stop is how long the guest stood still across the switch, as its counter on the two
	// nodes' consoles shows it (to about servedTick).
	stop time.Duration
	took time.Duration
	// switchGap is the time without an answer around the guest's arrival on the target.
	switchGap time.Duration
	// failedOnce counts the requests whose first attempt failed, failedTwice those whose retry
	// failed too: what a client that retries once sees as errors.
	failedOnce, failedTwice int
	// timeline is the switch's moments, in milliseconds from the source's last answer.
	timeline string
}

// servedTick is how often the served guest prints its counter: the precision of its stop.
const servedTick = 50 * time.Millisecond

// servedVM is a LiveMigrate VM on the pod network of two nodes with kube-proxy, behind a
// Service, Running: what the tests of a served VM's migration share.
type servedVM struct {
	network     *node.Network
	nodes       []*testNode
	kubeProxy   *node.ServiceProxy
	ns, address string
	vmi         *v1alpha1.VirtualMachineInstance
	source      *testNode
}

// startServedVM starts the controller, two nodes on a pod network whose kubelets give a pod grace
// seconds at most (each node handed to onNode, if any, once up), kube-proxy, and a 256 MiB VM with
// that grace behind a Service named as its app label, "served".
func startServedVM(tb testing.TB, grace int64, onNode func(*testNode)) servedVM {
	tb.Helper()
	setConfig(tb, true)
	startController(tb)
	s := servedVM{network: node.NewTestNetwork(tb)}
	s.nodes = startNodes(tb, 2, node.OnNetwork(s.network), func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })
	if onNode != nil {
		for _, n := range s.nodes {
			onNode(n)
		}
	}
	proxy, err := controlplane.EnsureKubeProxy(context.Background(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	s.kubeProxy = node.StartTestServiceProxy(tb, s.network, proxy, cluster.Kubeconfig, s.nodes[0].Name())
	s.ns = testNamespace(tb)
	vmi := createVMI(tb, s.ns, newVMI("served", strategy(v1alpha1.EvictionStrategyLiveMigrate), withPodNetwork, func(v *v1alpha1.VirtualMachineInstance) {
		v.Labels = map[string]string{"app": "served"}
		v.Spec.Memory = resource.MustParse("256Mi")
		v.Spec.TerminationGracePeriodSeconds = ptr.To(grace)
		v.Spec.Boot.Cmdline += fmt.Sprintf(" %s=%s", protocol.TickParam, servedTick)
	}))
	s.address = createService(tb, s.ns, "served")
	s.vmi = waitVMI(tb, s.ns, vmi.Name, bootTimeout, "phase Running", running)
	s.source = nodeOf(tb, s.nodes, s.vmi)
	return s
}

// migrateServedVM runs a VM on the pod network behind a Service on two nodes with kube-proxy,
// and live-migrates it for node pressure while a client asks the Service every clientInterval.
// It fails tb unless the guest answered before and after, the same boot, its counter going on.
func migrateServedVM(tb testing.TB) servedMigration {
	tb.Helper()
	const grace = 60
	served := startServedVM(tb, grace, nil)
	network, nodes, kubeProxy, ns, vmi, address, source := served.network, served.nodes, served.kubeProxy, served.ns, served.vmi, served.address, served.source
	// The guest's card and lease: its MAC and fixed private address, which no migration changes.
	mac, err := vmi.Spec.Interfaces[0].MAC(string(vmi.UID))
	if err != nil {
		tb.Fatal(err)
	}
	wantLine := protocol.Network("10.0.2.2/24", "10.0.2.1", mac.String())
	consoleCtx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if _, err := guest.WaitForLine(consoleCtx, source.consolePath(vmi), wantLine); err != nil {
		tb.Fatal(err)
	}
	sourcePod := launcherPod(tb, vmi)
	boot, before := waitGuestAnswer(tb, network, net.JoinHostPort(sourcePod.Status.PodIP, fmt.Sprint(protocol.ServePort)), bootTimeout)
	tb.Logf("the guest answers on its pod's address %s: boot %s counter %d", sourcePod.Status.PodIP, boot, before)
	waitGuestAnswer(tb, network, address, bootTimeout)
	tb.Logf("the guest answers through the Service %s: boot %s counter %d", address, boot, before)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	switches := watchSwitch(tb, ns)
	tb.Cleanup(switches.close)
	answered, collect := askEvery(ctx, network, address)
	watch := guest.WatchCounters(ctx, servedTick, func() []string { return []string{nodes[0].consolePath(vmi), nodes[1].consolePath(vmi)} })
	evicted := time.Now()
	evict(tb, source, vmi)
	moved := waitVMI(tb, ns, vmi.Name, grace*time.Second, "the VM on the other node",
		func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
		})
	target := nodeOf(tb, nodes, moved)
	targetPod := launcherPodOn(tb, moved, target.Name())
	if targetPod.Status.PodIP == sourcePod.Status.PodIP {
		tb.Fatalf("the target pod has the source pod's address %s", targetPod.Status.PodIP)
	}
	// The client goes on until it has had a second's worth of answers from the target.
	arrived := time.Now()
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return answered(arrived) >= int(time.Second/clientInterval), nil
	})
	if err != nil {
		tb.Fatalf("the guest did not answer through the Service after its migration: %d answers since", answered(arrived))
	}
	stall := watch()
	// Answers after this are only late retries of requests that timed out: the client asks no
	// more, so the time before them is no interruption.
	stopped := time.Now()
	stop()
	r := servedMigration{answers: collect(), took: time.Since(evicted), stop: stall.Switch, sourceAgentLog: source.agent.LogPath(), network: network,
		source: source, sourcePod: sourcePod, switches: switches,
		sourceAddress: net.JoinHostPort(sourcePod.Status.PodIP, fmt.Sprint(protocol.ServePort))}

	// Answers in the order they arrived: a retried request's answer comes after those of
	// requests sent later.
	var answers []*answer
	for i := range r.answers {
		a := &r.answers[i]
		if a.firstErr != nil {
			r.failedOnce++
		}
		if a.err != nil {
			r.failedTwice++
			continue
		}
		if a.boot != boot {
			tb.Fatalf("an answer at %s came from boot %s, not %s: the guest rebooted", a.received.Format(time.StampMilli), a.boot, boot)
		}
		answers = append(answers, a)
	}
	slices.SortStableFunc(answers, func(a, b *answer) int { return a.received.Compare(b.received) })
	var last, lastBefore, firstAfter, gapFrom, gapTo *answer
	// An answer delayed in delivery arrives after later ones (100 ms and more on a loaded
	// machine); a guest that went back answers below what it said well before.
	const reordered = 500 * time.Millisecond
	said, earlier := 0, 0
	for _, a := range answers {
		if last != nil && !a.received.After(stopped) {
			if gap := a.received.Sub(last.received); gap > r.interruption {
				r.interruption, gapFrom, gapTo = gap, last, a
			}
		}
		for ; earlier < len(answers) && a.received.Sub(answers[earlier].received) > reordered; earlier++ {
			said = max(said, answers[earlier].counter)
		}
		if a.counter < said-1 {
			tb.Errorf("the guest's counter went back: %d at %s, after %d more than %s before", a.counter, a.received.Format(time.StampMilli), said, reordered)
		}
		last = a
	}
	if last == nil || last.counter < before {
		tb.Fatalf("the client had no answer after the migration")
	}
	r.downtime = arrivalDowntime(tb, target, targetPod)
	// The switch's gap is the one around the guest's arrival on the target; the longest may be
	// another (a guest that a loaded machine stalls during the migration's copy).
	landed := guestArrived(tb, target, targetPod)
	lastBefore, firstAfter = gapFrom, gapTo
	for i := 1; i < len(answers); i++ {
		if a, b := answers[i-1], answers[i]; a.received.Before(landed) && !b.received.Before(landed) {
			r.switchGap, lastBefore, firstAfter = b.received.Sub(a.received), a, b
		}
	}
	if lastBefore != nil {
		r.timeline = switchTimeline(tb, switches, lastBefore, firstAfter, source, target, sourcePod, targetPod, kubeProxy.LogPath, vmi.Name) +
			failedRequests(lastBefore.received, r.answers)
		if gapFrom != lastBefore {
			r.timeline += fmt.Sprintf("  the longest time without an answer: %+d ms to %+d ms\n",
				gapFrom.received.Sub(lastBefore.received).Milliseconds(), gapTo.received.Sub(lastBefore.received).Milliseconds())
		}
	}
	return r
}

// createService makes a Service named app that selects the pods labelled app=app, serving the
// guest's port on port 80, and returns its address.
func createService(tb testing.TB, ns, app string) string {
	tb.Helper()
	svc, err := cluster.Kube.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(protocol.ServePort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, "80")
}

// arrivalDowntime is the downtime the target launcher logged once the guest arrived.
func arrivalDowntime(tb testing.TB, n *testNode, pod *corev1.Pod) time.Duration {
	tb.Helper()
	log, err := n.ContainerLog(pod, launcher.ContainerName)
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			Msg      string `json:"msg"`
			Downtime int64  `json:"downtime"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "migration statistics" && rec.Downtime > 0 {
			return time.Duration(rec.Downtime)
		}
	}
	tb.Fatalf("the target launcher logged no downtime:\n%s", tail(log, 10))
	return 0
}

// A VM on the pod network answers through a Service before, during and after a node-pressure
// live migration: the same boot, its counter going on, with one interruption around the switch.
func TestServiceFollowsTheVMThroughAMigration(t *testing.T) {
	r := migrateServedVM(t)
	t.Logf("%d requests, %d failed once, %d failed their retry too; longest interruption %s, migration downtime %s (libvirt), migration done %s after the eviction; the switch:\n%s",
		len(r.answers), r.failedOnce, r.failedTwice, r.interruption.Round(time.Millisecond), r.downtime.Round(time.Millisecond), r.took.Round(time.Millisecond), r.timeline)
	if len(r.answers)-r.failedTwice < 10 {
		t.Errorf("only %d answers of %d requests", len(r.answers)-r.failedTwice, len(r.answers))
	}
	// The source pod forwarded to the target while the Service still sent there; once no
	// EndpointSlice lists it, that path goes, and the old address no longer reaches the guest.
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, agent.ForwardAtMost, true, func(context.Context) (bool, error) {
		return len(logTimes(t, r.sourceAgentLog, podnetwork.MsgForwardEnded, "served")) > 0, nil
	})
	if err != nil {
		t.Fatalf("the source agent did not end the source pod's forward to the target pod: %v", err)
	}
	// The forward began when the guest paused for the switch-over, before libvirt's migration
	// call returned on the source: from then on, what reaches the source pod waits for the
	// guest in the target's tap instead of being lost.
	forwarded, returned := logTimes(t, r.sourceAgentLog, podnetwork.MsgForwarding, "served"), logTimes(t, r.sourceAgentLog, "libvirt migration ended", "served")
	switch {
	case len(forwarded) == 0:
		t.Errorf("the source agent logged no forward to the target pod")
	case len(returned) == 0:
		t.Errorf("the source agent logged no end of the libvirt migration")
	case forwarded[0].After(returned[len(returned)-1]):
		t.Errorf("the source pod began to forward at %s, %s after libvirt's migration call returned; want it from the switch-over's pause, before",
			forwarded[0].Format(time.StampMilli), forwarded[0].Sub(returned[len(returned)-1]))
	}
	if _, _, err := askGuest(context.Background(), r.network, r.sourceAddress); err == nil {
		t.Errorf("the guest still answers on the source pod's address %s after the forward ended", r.sourceAddress)
	}
	// The source launcher kept its pod, where the forward lives, until the agent said the
	// forward had ended, and then exited.
	ended := logTimes(t, r.sourceAgentLog, podnetwork.MsgForwardEnded, "served")[0]
	var released []time.Time
	err = wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if pod := r.switches.lastPod(r.sourcePod.Name); pod == nil || pod.Status.Phase != corev1.PodSucceeded {
			return false, nil
		}
		log, err := r.source.ContainerLog(r.sourcePod, launcher.ContainerName)
		released = logTimesIn(strings.NewReader(log), launcherrun.MsgHandoverDone, "served")
		return err == nil, nil
	})
	switch {
	case err != nil:
		t.Errorf("the source launcher's pod did not end within 30 s of the forward's end: %v", err)
	case len(released) == 0:
		t.Errorf("the source launcher ended without logging %q", launcherrun.MsgHandoverDone)
	case released[0].Before(ended):
		t.Errorf("the source launcher was released at %s, before the forward ended at %s", released[0].Format(time.StampMilli), ended.Format(time.StampMilli))
	}
}

// BenchmarkMigrationNetworkInterruption reports, for a node-pressure live migration of a VM on
// the pod network, the longest time a client asking its Service every 20 ms had no answer, beside
// the guest's stop at the switch (its counter on the nodes' consoles) and the migration's
// downtime as libvirt measured it in the same run, and the differences: what the network adds to
// the stop, and the requests that failed once and after a retry. With NETWORK_TIMELINES set to a
// file, each run's timeline of the switch is appended to it. Run with -count for several runs.
func BenchmarkMigrationNetworkInterruption(b *testing.B) {
	for b.Loop() {
		r := migrateServedVM(b)
		b.ReportMetric(float64(r.interruption.Milliseconds()), "interruption-ms")
		b.ReportMetric(float64(r.downtime.Milliseconds()), "downtime-ms")
		b.ReportMetric(float64((r.interruption - r.downtime).Milliseconds()), "added-ms")
		b.ReportMetric(float64(r.stop.Milliseconds()), "guest-stop-ms")
		b.ReportMetric(float64((r.interruption - r.stop).Milliseconds()), "added-to-stop-ms")
		run := len(networkRuns) + 1
		networkRuns = append(networkRuns, chart.Interruption{Run: fmt.Sprint(run), Interruption: r.interruption, Stop: r.stop, Downtime: r.downtime})
		if dir := chart.Dir(); dir != "" {
			// Drawn again after every run, so that the chart has all the runs of -count.
			if err := chart.WriteFile(dir, "network.svg", func(w io.Writer) error {
				return chart.Interruptions(w, "Network interruption during a migration, per run", networkRuns)
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(r.switchGap.Milliseconds()), "switch-ms")
		b.ReportMetric(float64((r.switchGap - r.downtime).Milliseconds()), "switch-added-ms")
		b.ReportMetric(float64(r.failedOnce), "failed-requests")
		b.ReportMetric(float64(r.failedTwice), "failed-after-retry")
		// Not b.Logf: a benchmark's log is cut after ten lines, which the nodes' own take.
		if path := os.Getenv("NETWORK_TIMELINES"); path != "" {
			appendFile(b, path, fmt.Sprintf("run %d: interruption %s (around the switch %s), downtime %s; of %d requests %d failed once, %d failed their retry too; the switch:\n%s\n",
				run, r.interruption.Round(time.Millisecond), r.switchGap.Round(time.Millisecond), r.downtime.Round(time.Millisecond), len(r.answers), r.failedOnce, r.failedTwice, r.timeline))
		}
	}
}

// networkRuns are the runs of BenchmarkMigrationNetworkInterruption so far (-count calls it once a run).
var networkRuns []chart.Interruption

// A VM with the bridge binding gets its pod's own address and MAC by DHCP and answers on it,
// and cannot be live-migrated (KubeVirt's reason).
func TestBridgeBindingGivesTheGuestThePodAddress(t *testing.T) {
	startController(t)
	network := node.NewTestNetwork(t)
	nodes := startNodes(t, 1, node.OnNetwork(network))
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("bridged", strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Interfaces = []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}
		v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "Running, and not live-migratable for its interface", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
		return running(v) && c != nil && c.Status == metav1.ConditionFalse && c.Reason == "InterfaceNotLiveMigratable"
	})
	pod := launcherPod(t, vmi)
	// The guest has the pod's own MAC, the one the pod network gave it: on the node's bridge no
	// other pod's.
	mac, err := network.PodMAC(string(pod.UID))
	if err != nil {
		t.Fatal(err)
	}
	prefix, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		t.Fatal(err)
	}
	gateway := netip.PrefixFrom(prefix, 24).Masked().Addr().Next()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	want := protocol.Network(pod.Status.PodIP+"/24", gateway.String(), mac.String())
	if _, err := guest.WaitForLine(ctx, nodes[0].consolePath(vmi), want); err != nil {
		t.Fatal(err)
	}
	boot, _ := waitGuestAnswer(t, network, net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(protocol.ServePort)), 30*time.Second)
	t.Logf("the guest has its pod's address %s and answers on it (boot %s)", pod.Status.PodIP, boot)
}
