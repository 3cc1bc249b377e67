package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/evictionrequest"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/netfault"
	"github.com/lifeboat-vm/lifeboat/test/node"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
	"github.com/lifeboat-vm/lifeboat/test/soak"
	"github.com/lifeboat-vm/lifeboat/test/soak/check"
)

var (
	// make test runs the short soak: seed 47, three minutes (two restarts, a manual migration, a
	// node-pressure eviction and an EvictionRequest, configuration changes, the controller killed,
	// a node frozen); make soak a longer one.
	soakDuration = flag.Duration("soak-duration", 3*time.Minute, "how long TestSoak breaks things (its last quarter is left to settle)")
	soakSeed     = flag.Uint64("soak-seed", 47, "the seed of TestSoak's plan: the same seed replays the same operations and faults")
	soakVMs      = flag.Int("soak-vms", 3, "VMs TestSoak runs")
	// Off by default: a real node takes the machine-wide lock of real nodes (test/realnode), which
	// other e2e tests wait for, and starting it with lifeboat's images takes minutes more.
	soakRealNode = flag.Bool("soak-real-node", false, "TestSoak also runs a real kubelet node (test/realnode), which its VMs move to and from")
)

const (
	// soakNodes is how many emulated nodes the soak runs its VMs on, besides the real one with
	// -soak-real-node.
	soakNodes = 3
	// realRunDir is the real node's agent's run directory, its hostPath: this machine's, as the
	// e2e real node has no mount namespace of its own (realnode.Config.StandardPaths).
	realRunDir = "/var/run/lifeboat"
	// agentPodsMount is where the agent's pod mounts the kubelet's pods directory
	// (manifests/agent.yaml): the agent's links to launchers' run volumes are below it.
	agentPodsMount = "/var/lib/kubelet/pods"
	// soakGrace is the VMs' and the nodes' grace period: a TCG guest's migration on a loaded
	// machine needs tens of seconds.
	soakGrace = 60
	// soakSettle is how long the cluster may take to settle once the plan is over.
	soakSettle = 5 * time.Minute
	// soakConsolePoll and soakAPIPoll are how often the soak reads the consoles and the API.
	soakConsolePoll = 500 * time.Millisecond
	soakAPIPoll     = 2 * time.Second
	// soakAnswerPoll is how often the soak asks each VM's Service.
	soakAnswerPoll = time.Second
	// soakCalm is how long the cluster must look settled before it counts as settled: longer
	// than the soak.Recent a guest that stopped still counts as counting and answering.
	soakCalm = 10 * time.Second
)

// TestSoak carries out a seed's plan (package soak: node-pressure evictions, drains, API
// evictions, EvictionRequests, manual migrations, restarts, stops and starts, configuration
// changes; agents, the controller, launchers' libvirt daemons and QEMUs killed, nodes frozen,
// nodes lost and tainted out of service, the migration network between two nodes cut or slowed,
// kube-apiserver and etcd restarted) on LiveMigrate VMs that count on their consoles, keep
// journals on shared disks and answer on the pod network through Services, on three emulated
// nodes (and, with -soak-real-node, a real kubelet node: see realSoakNode), while it records
// what a user sees (the consoles, the journals, the answers through the Services, the API); then
// it lets the cluster settle, prints the report, and fails on every violation the independent
// checker (package check) finds. make test runs a short one; make soak any: SOAK_DURATION,
// SOAK_SEED, SOAK_VMS, SOAK_REAL_NODE.
func TestSoak(t *testing.T) {
	nodeCount := soakNodes
	if *soakRealNode {
		nodeCount++
	}
	plan := soak.Plan(*soakSeed, *soakDuration, *soakVMs, nodeCount, soak.DefaultPace)
	t.Logf("soak: seed %d, %s, %d VMs on %d nodes (real node: %t), %d steps", *soakSeed, *soakDuration, *soakVMs, nodeCount, *soakRealNode, len(plan))
	for _, s := range plan {
		t.Logf("plan %s", s)
	}

	// The VMs answer on the pod network, each through a Service of its own, as kube-proxy routes it.
	pods := node.NewTestNetwork(t)
	var real *realnode.Node
	if *soakRealNode {
		// Before the LifeboatConfig and the controller: applying manifests/ sets both its own.
		real = startRealNodeOn(t, pods)
		deployLifeboatParts(t, real, false)
	}
	setConfig(t, true)
	ctrl := startControllerWithWebhook(t)
	nodes := startNodes(t, soakNodes, node.OnNetwork(pods), func(c *node.Config) { c.EvictionMaxPodGracePeriod = soakGrace })
	proxy, err := controlplane.EnsureKubeProxy(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	node.StartTestServiceProxy(t, pods, proxy, cluster.Kubeconfig, nodes[0].Name())
	ns := testNamespace(t)
	r := &soakRun{t: t, ns: ns, nodes: nodes, real: real, ctrl: ctrl, network: soakNetworkFaults(t, nodes), pods: pods,
		services: map[string]string{}, answering: map[string]time.Time{}, vmOf: map[string]string{}, cordoned: map[string]bool{},
		seenErrors: map[string]bool{}, journal: map[string]int{}, skipped: map[soak.Kind]int{},
		counting: map[string]soak.Counted{}, lastCounter: map[string]int{}, migrations: map[string]migrationSeen{}}
	for i := range *soakVMs {
		name := fmt.Sprintf("soak-%d", i)
		createClaim(t, ns, name, corev1.ReadWriteMany)
		template := newVMI(name, withClaimDisk(name), strategy(v1alpha1.EvictionStrategyLiveMigrate), withPodNetwork,
			func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](soakGrace)
			})
		vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.VirtualMachineSpec{
			RunStrategy: v1alpha1.RunStrategyAlways,
			Template: v1alpha1.VirtualMachineInstanceTemplateSpec{ObjectMeta: v1alpha1.TemplateMeta{Labels: map[string]string{"app": name}},
				Spec: template.Spec}}}
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r.services[name] = createService(t, ns, name)
		r.vms = append(r.vms, name)
	}
	for _, name := range r.vms {
		waitVMI(t, ns, name, 2*bootTimeout, "Running", running)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var observers sync.WaitGroup
	observers.Add(2)
	go func() { defer observers.Done(); r.observeAPI(ctx) }()
	go func() { defer observers.Done(); r.observeConsoles(ctx) }()
	for _, name := range r.vms {
		observers.Go(func() { r.observeService(ctx, name) })
	}
	defer func() { cancel(); observers.Wait() }()
	// Every guest counts, and answers through its Service, before the first step, so that its
	// boot is not taken for a stop.
	if err := wait.PollUntilContextTimeout(context.Background(), time.Second, bootTimeout, true, func(context.Context) (bool, error) {
		return r.allCounting() && r.allAnswering(), nil
	}); err != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, n := range nodes {
			paths, _ := filepath.Glob(filepath.Join(n.HostPath("/var/run/lifeboat"), "domains", "*", "console.log"))
			for _, p := range paths {
				b, _ := os.ReadFile(p)
				t.Logf("console %s:\n%s", p, tail(string(b), 5))
			}
		}
		t.Fatalf("not every guest counts on its console and answers through its Service within %s: instances %v, last counters %v, last answers %v",
			bootTimeout, r.vmOf, r.lastCounter, r.answering)
	}

	start := time.Now()
	var ends sync.WaitGroup
	for _, s := range plan {
		select {
		case <-time.After(time.Until(start.Add(s.At))):
		case <-ctx.Done():
		}
		r.do(s, &ends)
	}
	ends.Wait()
	// The plan's end: every cordon lifted (a drain's uncordon may have been cut short).
	for n := range r.cordonedNodes() {
		r.setCordon(n, false)
	}
	t.Logf("soak: the plan is over after %s; settling", time.Since(start).Round(time.Second))
	settled := time.Now()
	calm := soak.Calm{Window: soakCalm}
	if err := wait.PollUntilContextTimeout(context.Background(), soakAPIPoll, soakSettle, true, func(context.Context) (bool, error) {
		return calm.Look(time.Now(), r.settled(settled)), nil
	}); err != nil {
		t.Errorf("the cluster did not settle within %s of the plan's end (every LiveMigrate VM Running, nothing held)", soakSettle)
	} else {
		t.Logf("soak: settled %s after the plan's end", calm.Since().Sub(settled).Round(time.Second))
	}
	// The report, also when the check below fails.
	defer r.report()
	// Settled must stay settled: a copy that resumes late, or a guest that stops, shows here.
	kubewait.Consistently(t, 20*time.Second, "every LiveMigrate VM running once settled", func(context.Context) error {
		if !r.allCounting() {
			return errors.New("a guest stopped counting")
		}
		if silent := r.silent(); silent != "" {
			return fmt.Errorf("a guest stopped answering through its Service: %s", silent)
		}
		return nil
	})
	cancel()
	observers.Wait()
}

// report prints the checker's report on what the soak recorded, its last snapshot taken as the
// settled one, and fails the test on each violation.
func (r *soakRun) report() {
	h := r.history()
	last := h.Snapshots[len(h.Snapshots)-1]
	h.Settled = &last
	h.Served = true
	faults := map[string]bool{}
	for k := range soak.Faults {
		faults[string(k)] = true
	}
	report := check.Summarise(h, check.DefaultLimits(), faults)
	var out bytes.Buffer
	fmt.Fprintf(&out, "soak: seed %d, duration %s, %d VMs, nodes %v; steps skipped (nothing to act on): %v\n", *soakSeed, *soakDuration, *soakVMs, r.nodeNames(), r.skipped)
	report.Print(&out)
	r.printRealNode(&out)
	r.t.Log("\n" + out.String())
	fmt.Print(out.String())
	for _, v := range report.Violations {
		r.t.Errorf("violation: %s", v)
	}
}

// soakRun is one soak's cluster and what it recorded.
type soakRun struct {
	t     *testing.T
	ns    string
	nodes []*testNode
	// real is the real kubelet node, after the emulated ones in the plan's numbering; nil
	// without -soak-real-node. realMu serialises its kubelet's restarts.
	real   *realnode.Node
	realMu sync.Mutex
	ctrl   *webhookController
	vms    []string
	// pods is the pod network; services the address of each VM's Service on it.
	pods     *node.Network
	services map[string]string
	// network cuts or slows the migration network between two nodes' agents; nil where the
	// machine cannot (the soak skips those faults).
	network *netfault.Faults

	mu          sync.Mutex
	consoles    []check.Console
	journals    []check.Journal
	snapshots   []check.Snapshot
	actions     []check.Action
	vmOf        map[string]string // VMI UID → VM (namespace/name)
	cordoned    map[string]bool
	seenErrors  map[string]bool // console streams' error lines already recorded
	journal     map[string]int  // each stream's last journal length recorded
	skipped     map[soak.Kind]int
	counting    map[string]soak.Counted // VM → the instance whose counter rose last, and when
	answers     []check.Answer
	answering   map[string]time.Time // VM → when it last answered through its Service
	lastCounter map[string]int       // each stream's last counter
	// migrations are the migrations the API showed, as last seen.
	migrations map[string]migrationSeen
}

// migrationSeen is a migration's nodes and phase as the API last showed them.
type migrationSeen struct{ source, target, phase string }

// printRealNode says what the real node took part in: the soak's operations and faults there by
// kind (and the starts that ended them), the migrations from and to it by their last phase, and
// how many readings of guests' consoles were made there.
func (r *soakRun) printRealNode(out io.Writer) {
	if r.real == nil {
		return
	}
	name := r.real.Name()
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := map[string]int{}
	for _, a := range r.actions {
		if a.Node == name {
			kinds[a.Kind]++
		}
	}
	readings := 0
	for _, c := range r.consoles {
		if c.Node == name {
			readings++
		}
	}
	from, to := map[string]int{}, map[string]int{}
	for _, m := range r.migrations {
		if m.source == name {
			from[m.phase]++
		}
		if m.target == name {
			to[m.phase]++
		}
	}
	fmt.Fprintf(out, "on the real node %s: %v; migrations from it %v, to it %v; console readings there %d\n", name, kinds, from, to, readings)
}

func (r *soakRun) history() check.History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return check.History{Consoles: r.consoles, Journals: r.journals, Snapshots: r.snapshots, Actions: r.actions, Answers: r.answers}
}

// record notes an action the soak took.
func (r *soakRun) record(a check.Action) {
	a.At = time.Now()
	r.mu.Lock()
	r.actions = append(r.actions, a)
	r.mu.Unlock()
	r.t.Logf("soak %s: %s vm=%s node=%s", a.At.UTC().Format("15:04:05.000"), a.Kind, a.VM, a.Node)
}

func (r *soakRun) skip(s soak.Step, why string) {
	r.mu.Lock()
	r.skipped[s.Kind]++
	r.mu.Unlock()
	r.t.Logf("soak: skipped %s: %s", s, why)
}

func (r *soakRun) cordonedNodes() map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for n, on := range r.cordoned {
		if on {
			out[n] = true
		}
	}
	return out
}

// observeAPI takes a snapshot of what the API shows every soakAPIPoll.
func (r *soakRun) observeAPI(ctx context.Context) {
	_ = wait.PollUntilContextCancel(ctx, soakAPIPoll, true, func(ctx context.Context) (bool, error) {
		o, err := r.list(ctx)
		if err != nil {
			return false, nil // the API server may be the fault; the next poll tries again
		}
		s := check.SnapshotOf(time.Now(), o)
		r.mu.Lock()
		for _, v := range o.VMIs {
			r.vmOf[string(v.UID)] = v.Namespace + "/" + v.Name
		}
		for _, m := range o.Migrations {
			r.migrations[m.Name] = migrationSeen{source: m.Status.SourceNode, target: m.Status.TargetNode, phase: string(m.Status.Phase)}
		}
		r.snapshots = append(r.snapshots, s)
		r.mu.Unlock()
		return false, nil
	})
}

func (r *soakRun) list(ctx context.Context) (check.Objects, error) {
	o := check.Objects{Cordoned: r.cordonedNodes()}
	lb := cluster.Lifeboat.LifeboatV1alpha1()
	vms, err := lb.VirtualMachines(r.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	vmis, err := lb.VirtualMachineInstances(r.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	migrations, err := lb.VirtualMachineInstanceMigrations(r.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	pods, err := cluster.Kube.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	nodes, err := cluster.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	budgets, err := cluster.Kube.PolicyV1().PodDisruptionBudgets(r.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	evictions, err := cluster.Kube.LifecycleV1alpha1().Evictions(r.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return o, err
	}
	o.VMs, o.VMIs, o.Migrations, o.Pods, o.Budgets, o.Evictions = vms.Items, vmis.Items, migrations.Items, pods.Items, budgets.Items, evictions.Items
	for _, n := range nodes.Items {
		if slices.Contains(r.nodeNames(), n.Name) {
			o.Nodes = append(o.Nodes, n)
		}
	}
	return o, nil
}

// observeConsoles reads every guest console on every node every soakConsolePoll: its last
// counter, its journal's last report and its error lines.
func (r *soakRun) observeConsoles(ctx context.Context) {
	_ = wait.PollUntilContextCancel(ctx, soakConsolePoll, true, func(context.Context) (bool, error) {
		for _, n := range r.nodes {
			paths, _ := filepath.Glob(filepath.Join(n.HostPath("/var/run/lifeboat"), "domains", "*", "console.log"))
			for _, path := range paths {
				r.readConsole(n.Name(), filepath.Dir(path), nil)
			}
		}
		if r.real != nil {
			// The links of the real node's agent point where its pod sees the pods directory.
			domains := filepath.Join(realRunDir, "domains")
			entries, _ := os.ReadDir(domains)
			for _, e := range entries {
				r.readConsole(r.real.Name(), filepath.Join(domains, e.Name()), map[string]string{agentPodsMount: r.real.PodsDir()})
			}
		}
		return false, nil
	})
}

func (r *soakRun) readConsole(nodeName, dir string, mounts map[string]string) {
	read, err := soak.ReadConsole(nodeName, dir, mounts)
	if err != nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	instance, stream := read.Instance, read.Stream
	vm, ok := r.vmOf[instance]
	if !ok {
		return
	}
	r.consoles = append(r.consoles, check.Console{At: now, VM: vm, Instance: instance, Node: nodeName, Stream: stream, Counter: read.Counter})
	if read.Through > r.journal[stream] {
		r.journal[stream] = read.Through
		r.journals = append(r.journals, check.Journal{At: now, VM: vm, Instance: instance, Through: read.Through})
	}
	for _, e := range read.Errs {
		if !r.seenErrors[stream+e] {
			r.seenErrors[stream+e] = true
			r.journals = append(r.journals, check.Journal{At: now, VM: vm, Instance: instance, Err: e})
		}
	}
	if read.Counter > r.lastCounter[stream] {
		r.counting[vm] = soak.Counted{Instance: instance, At: now}
	}
	r.lastCounter[stream] = read.Counter
}

// observeService asks the VM's Service every soakAnswerPoll, as a client would, and records each
// answer: the boot that answered and its counter (which of the VM's pods answered, a client cannot tell).
func (r *soakRun) observeService(ctx context.Context, name string) {
	vm := r.ns + "/" + name
	_ = wait.PollUntilContextCancel(ctx, soakAnswerPoll, true, func(ctx context.Context) (bool, error) {
		boot, counter, err := askGuest(ctx, r.pods, r.services[name])
		if err != nil {
			return false, nil
		}
		now := time.Now()
		r.mu.Lock()
		r.answers = append(r.answers, check.Answer{At: now, VM: vm, Boot: boot, Counter: counter})
		r.answering[vm] = now
		r.mu.Unlock()
		return false, nil
	})
}

// seen is what the soak saw of its guests so far.
func (r *soakRun) seen() soak.Seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := soak.Seen{Counting: maps.Clone(r.counting), Answered: maps.Clone(r.answering)}
	for _, vm := range r.vms {
		seen.VMs = append(seen.VMs, r.ns+"/"+vm)
	}
	return seen
}

// allAnswering says every VM answered through its Service within soak.Recent.
func (r *soakRun) allAnswering() bool { return r.silent() == "" }

// silent names the VMs that have not answered through their Services within soak.Recent, with
// their last answers; empty if none.
func (r *soakRun) silent() string {
	seen := r.seen()
	var out []string
	for _, vm := range seen.Silent(time.Now()) {
		out = append(out, fmt.Sprintf("%s (last answer %s)", vm, seen.Answered[vm].UTC().Format("15:04:05.000")))
	}
	return strings.Join(out, ", ")
}

// allCounting says every VM's counter rose within soak.Recent, on whichever console.
func (r *soakRun) allCounting() bool { return r.seen().AllCounting(time.Now()) }

// settled says the last snapshot, taken after since, shows the cluster settled (soak.Settled).
func (r *soakRun) settled(since time.Time) bool {
	r.mu.Lock()
	if len(r.snapshots) == 0 {
		r.mu.Unlock()
		return false
	}
	last := r.snapshots[len(r.snapshots)-1]
	r.mu.Unlock()
	return soak.Settled(last, r.seen(), since, time.Now())
}

// do carries out one step; a step with an end (For) ends in a goroutine ends waits for.
func (r *soakRun) do(s soak.Step, ends *sync.WaitGroup) {
	ctx := context.Background()
	name := r.vms[s.VM]
	vmName := r.ns + "/" + name
	// The step's node by name; n is an emulated one, for the faults the real node does not
	// take (a freeze, a lost node, the migration network): a step that draws the real node
	// falls on an emulated one.
	nodeName := r.nodeNames()[s.Node]
	n := r.nodes[s.Node%len(r.nodes)]
	if r.isReal(nodeName) && slices.Contains([]soak.Kind{soak.NodeFreeze, soak.NodeLost, soak.NetworkCut, soak.NetworkSlow}, s.Kind) {
		r.t.Logf("soak: the real node takes no %s; it falls on an emulated node", s.Kind)
	}
	later := func(what func()) {
		ends.Add(1)
		go func() {
			defer ends.Done()
			<-time.After(s.For)
			what()
		}()
	}
	switch s.Kind {
	case soak.NodePressureEviction:
		pod, on := r.runningPod(name)
		if pod == nil {
			r.skip(s, "the VM has no running launcher pod")
			return
		}
		r.record(check.Action{Kind: string(s.Kind), VM: vmName, Node: on})
		ends.Add(1)
		go func() {
			defer ends.Done()
			if r.isReal(on) {
				r.realPressure(pod)
				return
			}
			if err := r.emulated(on).EvictPod(ctx, pod.Namespace, pod.Name); err != nil {
				r.t.Logf("soak: the node-pressure eviction of %s: %v", pod.Name, err)
			}
		}()
	case soak.Drain:
		r.setCordon(nodeName, true)
		r.record(check.Action{Kind: string(s.Kind), Node: nodeName})
		// kubectl drain evicts every pod of the node and asks again until each is gone.
		ends.Add(1)
		go func() {
			defer ends.Done()
			deadline := time.Now().Add(s.For)
			_ = wait.PollUntilContextTimeout(ctx, 5*time.Second, time.Until(deadline), true, func(ctx context.Context) (bool, error) {
				pods, err := cluster.Kube.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, nil
				}
				left := 0
				for _, p := range pods.Items {
					if p.Spec.NodeName == nodeName && p.DeletionTimestamp == nil && !podEnded(&p) {
						left++
						_ = cluster.Kube.CoreV1().Pods(r.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
					}
				}
				return left == 0, nil
			})
		}()
	case soak.Uncordon:
		if !r.cordonedNodes()[nodeName] {
			r.skip(s, "the node is not cordoned")
			return
		}
		r.setCordon(nodeName, false)
		r.record(check.Action{Kind: string(s.Kind), Node: nodeName})
	case soak.APIEviction:
		pod, on := r.runningPod(name)
		if pod == nil {
			r.skip(s, "the VM has no running launcher pod")
			return
		}
		r.record(check.Action{Kind: string(s.Kind), VM: vmName, Node: on})
		if err := cluster.Kube.CoreV1().Pods(r.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}); err != nil {
			r.t.Logf("soak: the API eviction of %s: %v", pod.Name, err)
		}
	case soak.EvictionRequest:
		pod, on := r.runningPod(name)
		if pod == nil {
			r.skip(s, "the VM has no running launcher pod")
			return
		}
		r.record(check.Action{Kind: string(s.Kind), VM: vmName, Node: on})
		erc, err := evictionrequest.Request(ctx, cluster.Kube, pod, soakRequester)
		if err != nil {
			r.t.Logf("soak: asking the eviction of %s: %v", pod.Name, err)
			return
		}
		ends.Add(1)
		go func() { defer ends.Done(); r.followEvictionRequest(erc, pod) }()
	case soak.ManualMigration:
		r.record(check.Action{Kind: string(s.Kind), VM: vmName})
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(r.ns).Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-manual-"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: name}}, metav1.CreateOptions{})
		if err != nil {
			r.t.Logf("soak: the manual migration of %s: %v", name, err)
		}
	case soak.Restart:
		r.record(check.Action{Kind: string(s.Kind), VM: vmName, Restart: true})
		if err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(r.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			r.t.Logf("soak: restarting %s: %v", name, err)
		}
	case soak.StopStart:
		r.record(check.Action{Kind: string(s.Kind), VM: vmName, Restart: true})
		r.setRunStrategy(name, v1alpha1.RunStrategyHalted)
		later(func() {
			r.record(check.Action{Kind: "vm-start", VM: vmName, Restart: true, Ends: string(s.Kind)})
			r.setRunStrategy(name, v1alpha1.RunStrategyAlways)
		})
	case soak.Bandwidth, soak.PostCopy:
		r.record(check.Action{Kind: string(s.Kind)})
		r.updateConfig(func(c *v1alpha1.LifeboatConfig) {
			if s.Kind == soak.PostCopy {
				c.Spec.Migrations.AllowPostCopy = ptr.To(s.Value == 1)
			} else if s.Value == 0 {
				c.Spec.Migrations.BandwidthPerMigration = nil
			} else {
				c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse(fmt.Sprintf("%dMi", s.Value)))
			}
		})
	case soak.AgentKill:
		// The source or the target of a migration under way, when there is one.
		if busy := r.migratingNode(); busy != "" {
			nodeName = busy
		}
		if r.isReal(nodeName) {
			r.killRealAgent(s, ends)
			return
		}
		tn := r.emulated(nodeName)
		r.record(check.Action{Kind: string(s.Kind), Node: nodeName})
		tn.agent.Kill()
		later(func() { r.restart(tn.agent, s.Kind) })
	case soak.ControllerKill:
		r.record(check.Action{Kind: string(s.Kind)})
		r.ctrl.Kill()
		later(func() { r.restart(r.ctrl.proc, s.Kind) })
	case soak.LibvirtdKill, soak.QEMUKill:
		pod, on := r.runningPod(name)
		if pod == nil {
			r.skip(s, "the VM has no running launcher pod")
			return
		}
		pid := podProcess(pod, "libvirtd")
		switch {
		case s.Kind == soak.QEMUKill && r.isReal(on):
			pid = realQEMU(pod, r.ns, name)
		case s.Kind == soak.QEMUKill:
			pid = qemuOn(r.emulated(on), r.ns, name)
		}
		if pid == 0 {
			r.skip(s, "no such process of pod "+pod.Name)
			return
		}
		r.record(check.Action{Kind: string(s.Kind), VM: vmName, Node: on, Fatal: soak.Fatal[s.Kind]})
		_ = syscall.Kill(pid, syscall.SIGKILL)
	case soak.NodeFreeze:
		r.record(check.Action{Kind: string(s.Kind), Node: n.Name()})
		stopped := freezeNode(r.t, n)
		later(func() {
			r.record(check.Action{Kind: "node-thaw", Node: n.Name(), Ends: string(s.Kind)})
			thawNode(n, stopped)
		})
	case soak.NetworkCut, soak.NetworkSlow:
		if r.network == nil {
			r.skip(s, "network faults need root, cgroup v2 and nftables")
			return
		}
		a, b := r.migratingPair()
		if a == nil {
			a, b = n, r.nodes[(s.Node%len(r.nodes)+1)%len(r.nodes)]
		}
		r.record(check.Action{Kind: string(s.Kind), Node: a.Name() + "," + b.Name()})
		for _, way := range [][2]*testNode{{a, b}, {b, a}} {
			to := netip.MustParseAddr(way[1].Address())
			var err error
			if s.Kind == soak.NetworkCut {
				err = r.network.Cut(way[0].Name(), to)
			} else {
				err = r.network.Slow(way[0].Name(), uint64(s.Value)<<10, to)
			}
			if err != nil {
				r.t.Errorf("soak: %s from %s to %s: %v", s.Kind, way[0].Name(), way[1].Name(), err)
			}
		}
		later(func() {
			r.record(check.Action{Kind: "network-healed", Node: a.Name() + "," + b.Name(), Ends: string(s.Kind)})
			if err := r.network.Heal(); err != nil {
				r.t.Errorf("soak: healing the network: %v", err)
			}
		})
	case soak.APIServerRestart, soak.EtcdRestart:
		component := map[soak.Kind]string{soak.APIServerRestart: "kube-apiserver", soak.EtcdRestart: "etcd"}[s.Kind]
		r.record(check.Action{Kind: string(s.Kind)})
		if err := cluster.Kill(component); err != nil {
			r.t.Errorf("soak: killing %s: %v", component, err)
			return
		}
		later(func() {
			r.record(check.Action{Kind: component + "-started", Ends: string(s.Kind)})
			if err := cluster.StartAgain(ctx, component); err != nil {
				r.t.Errorf("soak: starting %s again: %v", component, err)
			}
		})
	case soak.NodeLost:
		// The node of the step's VM, when it runs (and is not the real one): a lost node with a
		// guest on it.
		if _, on := r.runningPod(name); on != "" && !r.isReal(on) {
			n = r.emulated(on)
		}
		r.record(check.Action{Kind: string(s.Kind), Node: n.Name()})
		stopped := freezeNode(r.t, n)
		ends.Add(1)
		go func() { defer ends.Done(); r.loseNode(n, stopped, s.For) }()
	default:
		r.t.Fatalf("the soak cannot do %s", s.Kind)
	}
}

// soakRequester is the requester of the soak's EvictionRequests.
const soakRequester = "soak.lifeboat.example/requester"

// soakEvictionWait is how long the soak, as the evictionrequest controller, follows an
// EvictionRequest: past the checker's limit on an unanswered one.
const soakEvictionWait = 6 * time.Minute

// followEvictionRequest plays the evictionrequest controller's part for the soak's request: once
// lifeboat reports completion it moves on to the next responder; once the pod is gone it records
// the target evicted. The checker judges from the API whether lifeboat answered in time.
func (r *soakRun) followEvictionRequest(erc *evictionrequest.Controller, pod *corev1.Pod) {
	ctx := context.Background()
	var outcome string
	err := wait.PollUntilContextTimeout(ctx, soakAPIPoll, soakEvictionWait, true, func(ctx context.Context) (bool, error) {
		ev, err := erc.Get(ctx)
		if err != nil {
			return false, nil
		}
		if e := responder.Entry(ev); e != nil && e.CompletionTime != nil {
			next, err := erc.Advance(ctx)
			outcome = fmt.Sprintf("lifeboat completed (%q); next responder %q, %v", ptr.Deref(e.Message, ""), next, err)
			return true, nil
		}
		if _, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			outcome = fmt.Sprintf("the pod was deleted before lifeboat completed; target evicted: %v", erc.TargetDeleted(ctx))
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		outcome = fmt.Sprintf("no completion from lifeboat within %s", soakEvictionWait)
	}
	r.t.Logf("soak: the EvictionRequest of pod %s: %s", pod.Name, outcome)
}

// loseNode carries a NodeLost fault through, within: the frozen node found NotReady, tainted out
// of service, its VMs' new instances running and counting elsewhere, the node resumed (its old QEMUs must end,
// and the checker's consoles show whether they counted beside the new copies), the taint removed.
func (r *soakRun) loseNode(n *testNode, stopped []int, within time.Duration) {
	ctx := context.Background()
	deadline := time.Now().Add(within)
	var qemus []int
	for _, pid := range stopped {
		if qemuOf([]int{pid}) != 0 {
			qemus = append(qemus, pid)
		}
	}
	thaw := func() {
		r.record(check.Action{Kind: "node-thaw", Node: n.Name(), Ends: string(soak.NodeLost)})
		thawNode(n, stopped)
	}
	notReady := wait.PollUntilContextTimeout(ctx, time.Second, time.Until(deadline.Add(-time.Minute)), true, func(ctx context.Context) (bool, error) {
		node, err := cluster.Kube.CoreV1().Nodes().Get(ctx, n.Name(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status != corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if notReady != nil {
		r.t.Errorf("soak: node %s still Ready %s after it froze", n.Name(), within-time.Minute)
		thaw()
		return
	}
	// The instances on the node when the admin declares it off: each must come back elsewhere.
	old := map[string]types.UID{}
	if vmis, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(r.ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, v := range vmis.Items {
			if v.Status.NodeName == n.Name() && !v.Status.Phase.Terminal() {
				old[v.Name] = v.UID
			}
		}
	}
	r.t.Logf("soak: node %s NotReady; its instances: %v", n.Name(), old)
	r.record(check.Action{Kind: "node-out-of-service", Node: n.Name(), Fatal: true, Ends: string(soak.NodeLost)})
	r.setOutOfService(n.Name(), true)
	// Back: a new instance runs elsewhere and its guest counts, so that the old one, resumed,
	// would count beside it.
	back := wait.PollUntilContextTimeout(ctx, soakAPIPoll, time.Until(deadline.Add(-30*time.Second)), true, func(ctx context.Context) (bool, error) {
		for name, uid := range old {
			v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(r.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || v.UID == uid || !running(v) || v.Status.NodeName == n.Name() {
				return false, nil
			}
			r.mu.Lock()
			c := r.counting[r.ns+"/"+name]
			counts := c.Instance == string(v.UID) && time.Since(c.At) < soak.Recent
			r.mu.Unlock()
			if !counts {
				return false, nil
			}
		}
		return true, nil
	})
	if back != nil {
		r.t.Errorf("soak: the VMs of out-of-service node %s (%v) did not all run and count elsewhere within %s of its freeze", n.Name(), old, within)
	}
	thaw()
	thawed := time.Now()
	ended := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, pid := range qemus {
			if processAlive(pid) {
				return false, nil
			}
		}
		return true, nil
	})
	if ended != nil {
		r.t.Errorf("soak: an old QEMU of out-of-service node %s (of %v) still runs a minute after the node resumed", n.Name(), qemus)
	} else {
		r.t.Logf("soak: the %d old QEMUs of node %s ended %s after it resumed", len(qemus), n.Name(), time.Since(thawed).Round(time.Millisecond))
	}
	r.record(check.Action{Kind: "node-out-of-service-removed", Node: n.Name(), Ends: string(soak.NodeLost)})
	r.setOutOfService(n.Name(), false)
}

// setOutOfService taints the node node.kubernetes.io/out-of-service, as the admin does once
// it is known to be off, or removes the taint once it is back.
func (r *soakRun) setOutOfService(name string, on bool) {
	err := throughOutages(func() error {
		n, err := cluster.Kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints := slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeOutOfService })
		if on {
			taints = append(taints, corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
		}
		n.Spec.Taints = taints
		_, err = cluster.Kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		r.t.Errorf("soak: tainting node %s out of service (%v): %v", name, on, err)
	}
}

func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// runningPod is the VM's launcher pod on the node its VMI runs on, and that node's name; nil
// and "" if none.
func (r *soakRun) runningPod(name string) (*corev1.Pod, string) {
	ctx := context.Background()
	v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(r.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || v.Status.Phase != v1alpha1.VMIRunning {
		return nil, ""
	}
	pods, err := cluster.Kube.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
	if err != nil {
		return nil, ""
	}
	for i, p := range pods.Items {
		if p.Spec.NodeName == v.Status.NodeName && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil &&
			slices.Contains(r.nodeNames(), p.Spec.NodeName) {
			return &pods.Items[i], p.Spec.NodeName
		}
	}
	return nil, ""
}

// nodeNames are the soak's nodes in the plan's numbering: the emulated ones, then the real one.
func (r *soakRun) nodeNames() []string {
	var out []string
	for _, n := range r.nodes {
		out = append(out, n.Name())
	}
	if r.real != nil {
		out = append(out, r.real.Name())
	}
	return out
}

// emulated is the emulated node of that name; nil if none.
func (r *soakRun) emulated(name string) *testNode {
	for _, n := range r.nodes {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// isReal says the node of that name is the real one.
func (r *soakRun) isReal(name string) bool { return r.real != nil && name == r.real.Name() }

// realPressure has the real kubelet's own eviction manager evict pod, as memory pressure does:
// its evictionSoft memory.available threshold set 2 GiB above what the machine has (the kubelet
// restarted with it, as an operator would; the pods run on), until the kubelet has evicted the
// pod (it may evict other pods of the node first: it picks), then the threshold set back.
func (r *soakRun) realPressure(pod *corev1.Pod) {
	r.realMu.Lock()
	defer r.realMu.Unlock()
	ctx := context.Background()
	soft := maps.Clone(r.real.KubeletConfig.EvictionSoft)
	available, threshold, err := r.real.CrossMemorySoftThreshold(ctx, 2<<30, func(*kubeletv1beta1.KubeletConfiguration) {})
	if err != nil {
		r.t.Errorf("soak: crossing the real node's soft eviction threshold: %v", err)
		return
	}
	r.t.Logf("soak: real node %s: memory.available %s, evictionSoft memory.available<%s", r.real.Name(), available, threshold)
	var outcome string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := cluster.Kube.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod.Name, "reason": "Evicted", "source": "kubelet"}.String()})
		if err == nil && len(events.Items) > 0 {
			outcome = "the kubelet evicted it: " + events.Items[0].Message
			return true, nil
		}
		if p, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) || (err == nil && podEnded(p)) {
			outcome = "the pod ended before the kubelet chose it"
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		outcome = "the kubelet did not evict it within 2m"
	}
	r.t.Logf("soak: the real kubelet's node-pressure eviction of %s: %s", pod.Name, outcome)
	if err := r.real.RestartKubelet(ctx, func(c *kubeletv1beta1.KubeletConfiguration) { c.EvictionSoft = soft }); err != nil {
		r.t.Errorf("soak: setting the real node's soft eviction threshold back: %v", err)
	}
}

// killRealAgent SIGKILLs the real node's agent, a container of its DaemonSet's pod; the kubelet
// starts it again (the pod's restartPolicy), which the soak records once the new one runs.
func (r *soakRun) killRealAgent(s soak.Step, ends *sync.WaitGroup) {
	name := r.real.Name()
	pid := envProcess("lifeboat-agent", "NODE_NAME="+name)
	if pid == 0 {
		r.skip(s, "the real node's agent is not running (its kubelet starts it again)")
		return
	}
	r.record(check.Action{Kind: string(s.Kind), Node: name})
	_ = syscall.Kill(pid, syscall.SIGKILL)
	ends.Add(1)
	go func() {
		defer ends.Done()
		err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 5*time.Minute, false, func(context.Context) (bool, error) {
			again := envProcess("lifeboat-agent", "NODE_NAME="+name)
			return again != 0 && again != pid, nil
		})
		if err != nil {
			r.t.Errorf("soak: the kubelet of %s did not start its agent again within 5m of its SIGKILL", name)
			return
		}
		r.record(check.Action{Kind: "lifeboat-agent-started", Node: name, Ends: string(s.Kind)})
	}()
}

// realQEMU is the pid of the QEMU of VM ns/name in launcher pod on the real node: the one in the
// pid namespace of the pod's launcher process; 0 if none.
func realQEMU(pod *corev1.Pod, ns, name string) int {
	launcherPID := podProcess(pod, "lifeboat-launcher")
	if launcherPID == 0 {
		return 0
	}
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", launcherPID))
	if err != nil {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !isQEMUOf(pid, ns, name) {
			continue
		}
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); ns == want {
			return pid
		}
	}
	return 0
}

// migratingPair is the source and the target node of a migration under way between emulated
// nodes; nils if none (the real node's agent is not in the network faults' groups).
func (r *soakRun) migratingPair() (source, target *testNode) {
	list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(r.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, nil
	}
	for _, m := range list.Items {
		if m.Status.Phase.Terminal() {
			continue
		}
		for _, a := range r.nodes {
			for _, b := range r.nodes {
				if a != b && a.Name() == m.Status.SourceNode && b.Name() == m.Status.TargetNode {
					return a, b
				}
			}
		}
	}
	return nil, nil
}

// soakNetworkFaults puts each node's agent in a group of its own, whose traffic to another node's
// address the network faults cut or slow (the agents carry the migrations' streams between
// nodes); the table and groups go when the test ends, failed or not. Nil where the machine
// cannot.
func soakNetworkFaults(t *testing.T, nodes []*testNode) *netfault.Faults {
	if err := netfault.Sweep(); err != nil {
		t.Logf("soak: removing what earlier runs' network faults left: %v", err)
	}
	f, err := netfault.New()
	if err != nil {
		t.Logf("soak: no network faults on this machine: %v", err)
		return nil
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("soak: removing the network faults' table and groups: %v", err)
		}
	})
	for _, n := range nodes {
		if err := f.Join(n.Name(), n.agent.Pid()); err != nil {
			t.Fatalf("soak: putting node %s's agent in its network group: %v", n.Name(), err)
		}
	}
	return f
}

// migratingNode is the name of the source or the target node of a migration under way; "" if none.
func (r *soakRun) migratingNode() string {
	list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(r.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, m := range list.Items {
		if m.Status.Phase.Terminal() {
			continue
		}
		for _, n := range r.nodeNames() {
			if n == m.Status.TargetNode || (m.Status.TargetNode == "" && n == m.Status.SourceNode) {
				return n
			}
		}
	}
	return ""
}

// restart starts a killed process again, as its Deployment or DaemonSet would.
func (r *soakRun) restart(p *proc, fault soak.Kind) {
	var err error
	for range 5 {
		if p.Process, err = controlplane.StartProcess(p.dir, p.name, filepath.Join(bins, p.name), p.args...); err == nil {
			r.record(check.Action{Kind: p.name + "-started", Ends: string(fault)})
			r.rejoinNetwork(p)
			return
		}
	}
	r.t.Errorf("soak: starting %s again: %v", p.name, err)
}

// rejoinNetwork puts a restarted agent back in its node's network group.
func (r *soakRun) rejoinNetwork(p *proc) {
	if r.network == nil {
		return
	}
	for _, n := range r.nodes {
		if n.agent == p {
			if err := r.network.Join(n.Name(), p.Pid()); err != nil {
				r.t.Errorf("soak: putting node %s's restarted agent in its network group: %v", n.Name(), err)
			}
		}
	}
}

func (r *soakRun) setCordon(name string, on bool) {
	r.mu.Lock()
	r.cordoned[name] = on
	r.mu.Unlock()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if err := throughOutages(func() error {
		_, err := cluster.Kube.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}); err != nil {
		r.t.Errorf("soak: cordoning %s (%v): %v", name, on, err)
	}
}

// soakOutage is the longest the soak's own changes wait out the API server: a restart of it or
// of etcd (its longest For) and its start.
const soakOutage = 90 * time.Second

// throughOutages does change, and again while it fails, for up to soakOutage: a user's change
// made while kube-apiserver or etcd restarts is made once they are back.
func throughOutages(change func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, soakOutage, true, func(context.Context) (bool, error) {
		last = change()
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w; last: %w", err, last)
	}
	return nil
}

func (r *soakRun) setRunStrategy(name string, s v1alpha1.RunStrategy) {
	patch := fmt.Sprintf(`{"spec":{"runStrategy":%q}}`, s)
	if err := throughOutages(func() error {
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(r.ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}); err != nil {
		r.t.Errorf("soak: setting %s's run strategy to %s: %v", name, s, err)
	}
}

func (r *soakRun) updateConfig(change func(*v1alpha1.LifeboatConfig)) {
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	err := throughOutages(func() error {
		c, err := configs.Get(context.Background(), v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(c)
		_, err = configs.Update(context.Background(), c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		r.t.Errorf("soak: changing the LifeboatConfig: %v", err)
	}
}

// qemuOn is the pid of the QEMU of VM ns/name among the processes of node n; 0 if none.
func qemuOn(n *testNode, ns, name string) int {
	for _, pid := range descendants(n.ContainerPIDs()) {
		if isQEMUOf(pid, ns, name) {
			return pid
		}
	}
	return 0
}
