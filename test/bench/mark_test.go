// Package bench holds lifeboat's benchmarks that need the real control plane.
package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/notifyserver"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

var signals = flag.Int("signals", 200, "signals per measurement")

// fakeDomains stands in for the launchers' libvirt: the benchmark measures the agent's path
// from a launcher's report to the API server, not libvirt.
type fakeDomains struct {
	mu      sync.Mutex
	domains map[string]*agent.Domain // by domain name
	// names holds each launcher's domain name, by VMI UID: a launcher's libvirt lists its own
	// domain only.
	names map[string]string
}

type fakeConn struct {
	d       *fakeDomains
	uid     string
	changes chan struct{}
}

func (d *fakeDomains) dial(_ context.Context, _, uid string) (agent.DomainConn, error) {
	return &fakeConn{d: d, uid: uid, changes: make(chan struct{})}, nil
}

func (c *fakeConn) Observe(_ context.Context, name string) (*agent.Domain, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	dom, ok := c.d.domains[name]
	if !ok {
		return nil, nil
	}
	cp := *dom
	return &cp, nil
}
func (c *fakeConn) Changes() <-chan struct{}               { return c.changes }
func (c *fakeConn) Shutdown(context.Context, string) error { return nil }
func (c *fakeConn) Destroy(context.Context, string) error  { return nil }
func (c *fakeConn) Close() error                           { return nil }
func (c *fakeConn) DomainNames(context.Context) ([]string, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if name := c.d.names[c.uid]; c.d.domains[name] != nil {
		return []string{name}, nil
	}
	return nil, nil
}
func (d *fakeDomains) set(name string, f func(*agent.Domain)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d.domains[name])
}

type bed struct {
	ctx        context.Context
	cp         *controlplane.ControlPlane
	ns         string
	domainsDir string
	domains    *fakeDomains
	server     *notifyserver.Server
	// vmis are the VMIs on the node now; each is signalled once (replace).
	vmis      []*v1alpha1.VirtualMachineInstance
	launchers map[types.UID]*fakeLauncher
	added     int
	// events has every VMI as the watch shows it, in the watch's order; it is closed when the
	// watch ends.
	events chan vmiEvent
}

// fakeLauncher is what the benchmark holds for a launcher: its libvirt socket, the agent's
// notify socket in its directory and its connection to it.
type fakeLauncher struct {
	dir     string
	libvirt net.Listener
	notify  net.Conn
	// stop ends the agent's notify server on the launcher's socket.
	stop context.CancelFunc
}

// vmiEvent is a VMI as a watch event showed it: running and marked for evacuation from the node or not.
type vmiEvent struct {
	uid             types.UID
	running, marked bool
}

const node = "bench-node"

// setUp starts a control plane, an agent for node, and n running VMIs on the node, each with a
// notify connection as its launcher holds.
func setUp(b *testing.B, n int) *bed {
	ctx, cp := startControlPlane(b)
	ns, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	_, err = cp.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Create(ctx, &v1alpha1.LifeboatConfig{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName},
		Spec: v1alpha1.LifeboatConfigSpec{
			FeatureGates:     []v1alpha1.FeatureGate{v1alpha1.FeatureGateNodePressureEvictionLiveMigration},
			EvictionStrategy: ptrTo(v1alpha1.EvictionStrategyLiveMigrate),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	runDir, err := os.MkdirTemp("", "lbb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(runDir) })
	t := &bed{
		ctx: ctx, cp: cp, ns: ns.Name, domainsDir: filepath.Join(runDir, "domains"),
		domains:   &fakeDomains{domains: map[string]*agent.Domain{}, names: map[string]string{}},
		launchers: map[types.UID]*fakeLauncher{}, events: make(chan vmiEvent, 1024),
	}

	if err := v1alpha1.AddToScheme(scheme.Scheme); err != nil {
		b.Fatal(err)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cp.Kube.CoreV1().Events("")})
	b.Cleanup(broadcaster.Shutdown)
	log := agentLog(b)
	reg := prometheus.NewRegistry()
	informers := lifeboatinformers.NewSharedInformerFactoryWithOptions(cp.Lifeboat, 0, lifeboatinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "status.nodeName=" + node
	}))
	configInformers := lifeboatinformers.NewSharedInformerFactory(cp.Lifeboat, 0)
	a, err := agent.New(agent.Config{
		NodeName: node, DomainsDir: t.domainsDir, Dial: t.domains.dial,
		Configs:           configInformers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(),
		MaxPodGracePeriod: ptrTo[int64](300),
		Recorder:          broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lifeboat-agent"}),
		Metrics:           agent.NewMetrics(reg), Log: log,
	}, cp.Lifeboat, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), configInformers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{configInformers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		b.Fatal(err)
	}
	// As the agent does for each launcher pod: a notify socket in each launcher's directory (add).
	t.server = notifyserver.New([]uint32{uint32(os.Getuid())}, a.HandleNotify, reg, log)
	informers.Start(ctx.Done())
	configInformers.Start(ctx.Done())
	go func() { _ = a.Run(ctx, 4) }()

	// The benchmark sees marks the way the evacuation controller will: through a watch.
	w, err := cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns.Name).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	go func() {
		defer close(t.events)
		for ev := range w.ResultChan() {
			if v, ok := ev.Object.(*v1alpha1.VirtualMachineInstance); ok {
				t.events <- vmiEvent{uid: v.UID, running: v.Status.Phase == v1alpha1.VMIRunning, marked: v.Status.EvacuationNodeName == node}
			}
		}
	}()
	for range n {
		t.vmis = append(t.vmis, t.add(b))
	}
	return t
}

// agentLog is the agent's log: a file shown, its end, when the benchmark fails.
func agentLog(b *testing.B) *slog.Logger {
	path := filepath.Join(b.TempDir(), "agent.log")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		f.Close()
		if !b.Failed() {
			return
		}
		if out, err := os.ReadFile(path); err == nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			b.Logf("the agent's log, its last lines:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return slog.New(slog.NewTextHandler(f, nil))
}

// add puts a new VMI on the node as a launcher does: its domain runs, its libvirt socket is where
// the agent finds launchers, and it says hello on the agent's notify socket in its directory. It
// returns once the watch shows the VMI running.
func (t *bed) add(b *testing.B) *v1alpha1.VirtualMachineInstance {
	ctx := t.ctx
	vmi, err := t.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(t.ns).Create(ctx, &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vm-%d", t.added)},
		Spec:       v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), Boot: v1alpha1.BootSource{Kernel: "/k"}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	t.added++
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIScheduled, node
	if vmi, err = t.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(t.ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	t.domains.mu.Lock()
	t.domains.domains[name] = &agent.Domain{State: agent.DomainRunning}
	t.domains.names[string(vmi.UID)] = name
	t.domains.mu.Unlock()

	l := &fakeLauncher{dir: filepath.Join(t.domainsDir, string(vmi.UID))}
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if l.libvirt, err = net.Listen("unix", filepath.Join(l.dir, contract.LibvirtSocket)); err != nil {
		b.Fatal(err)
	}
	var serveCtx context.Context
	serveCtx, l.stop = context.WithCancel(ctx)
	notifyPath := filepath.Join(l.dir, contract.NotifySocketName)
	go func() { _ = t.server.Serve(serveCtx, notifyPath, ref(vmi)) }()
	t.launchers[vmi.UID] = l
	b.Cleanup(func() { l.close() })

	t.await(b, vmi, "running", func(e vmiEvent) bool { return e.running })
	// The notify socket exists a moment after Serve starts.
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var dialErr error
		l.notify, dialErr = net.Dial("unix", notifyPath)
		return dialErr == nil, nil
	})
	if err != nil {
		b.Fatalf("the agent's notify socket %s accepted no connection within 10s", notifyPath)
	}
	if err := notify.Write(l.notify, &notify.Message{Kind: notify.KindHello, VMI: ref(vmi), Time: time.Now()}); err != nil {
		b.Fatal(err)
	}
	return vmi
}

func (l *fakeLauncher) close() {
	l.stop()
	if l.notify != nil {
		l.notify.Close()
	}
	l.libvirt.Close()
}

// replace ends the launcher of the VMI in slot i, which was signalled, and puts a new VMI in its
// place: as a SIGTERM'd launcher's VM leaves the node and another comes. A launcher is signalled
// once in its life, and the agent holds its report for as long as the launcher lives: a VMI
// signalled again would be marked already, its mark no new write.
func (t *bed) replace(b *testing.B, i int) {
	old := t.vmis[i]
	l := t.launchers[old.UID]
	delete(t.launchers, old.UID)
	l.close()
	t.domains.mu.Lock()
	delete(t.domains.domains, t.domains.names[string(old.UID)])
	delete(t.domains.names, string(old.UID))
	t.domains.mu.Unlock()
	if err := os.RemoveAll(l.dir); err != nil {
		b.Fatal(err)
	}
	if err := t.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(old.Namespace).Delete(t.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	t.vmis[i] = t.add(b)
}

func ref(v *v1alpha1.VirtualMachineInstance) notify.VMIRef {
	return notify.VMIRef{Namespace: v.Namespace, Name: v.Name, UID: string(v.UID)}
}

func ptrTo[T any](v T) *T { return &v }

// signal does what a launcher does on SIGTERM (record the signal in its domain, report it) and
// returns the time until the mark is visible in a watch. The VMI was never signalled: no event
// of it before the signal shows it marked.
func (t *bed) signal(b *testing.B, vmi *v1alpha1.VirtualMachineInstance) time.Duration {
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	start := time.Now()
	deadline := start.Add(45 * time.Second)
	t.domains.set(name, func(d *agent.Domain) { d.GracefulShutdown, d.PodDeadline = &start, &deadline })
	if err := notify.Write(t.launchers[vmi.UID].notify, &notify.Message{Kind: notify.KindGracefulShutdown, VMI: ref(vmi), Time: start, PodGracePeriodSeconds: 45}); err != nil {
		b.Fatal(err)
	}
	t.await(b, vmi, "marked", func(e vmiEvent) bool { return e.marked })
	return time.Since(start)
}

// await waits until the watch shows vmi as ok says (what, in words), skipping what it showed before.
func (t *bed) await(b *testing.B, vmi *v1alpha1.VirtualMachineInstance, what string, ok func(vmiEvent) bool) {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, open := <-t.events:
			if !open {
				b.Fatalf("the watch of VMIs ended while waiting for %s %s", vmi.Name, what)
			}
			if e.uid == vmi.UID && ok(e) {
				return
			}
		case <-timeout:
			b.Fatalf("the watch did not show %s %s within 10s", vmi.Name, what)
		}
	}
}

// bareStatusPatch is the baseline: one status PATCH round trip, nothing else.
func (t *bed) bareStatusPatch(b *testing.B, vmi *v1alpha1.VirtualMachineInstance, i int) time.Duration {
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"reason": fmt.Sprintf("Bench%d", i%2)}})
	start := time.Now()
	if _, err := t.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Patch(context.Background(), vmi.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkMarkLatency measures, against the real API server, the time from a launcher's
// SIGTERM (recorded and reported, as the launcher does) to the evacuation mark visible in a
// watch, with 1 and with 50 VMs on the node, beside a bare status PATCH measured in the same run.
// Each signal goes to a VMI never signalled before, which then leaves the node for a new one
// (replace): every sample is a new mark. It reports p50 and p99 in milliseconds and the ratio of the p99s.
func BenchmarkMarkLatency(b *testing.B) {
	for _, vms := range []int{1, 50} {
		b.Run(fmt.Sprintf("vms=%d", vms), func(b *testing.B) {
			t := setUp(b, vms)
			for b.Loop() {
				var marks, patches []time.Duration
				for i := range *signals {
					slot := i % len(t.vmis)
					vmi := t.vmis[slot]
					marks = append(marks, t.signal(b, vmi))
					patches = append(patches, t.bareStatusPatch(b, vmi, i))
					t.replace(b, slot)
				}
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
				b.ReportMetric(ms(quantile(marks, 0.50)), "mark-p50-ms")
				b.ReportMetric(ms(quantile(marks, 0.99)), "mark-p99-ms")
				b.ReportMetric(ms(quantile(patches, 0.50)), "patch-p50-ms")
				b.ReportMetric(ms(quantile(patches, 0.99)), "patch-p99-ms")
				b.ReportMetric(float64(quantile(marks, 0.99))/float64(quantile(patches, 0.99)), "p99-ratio")
			}
		})
	}
}
