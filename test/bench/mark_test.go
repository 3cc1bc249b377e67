// Package bench holds lifeboat's benchmarks that need the real control plane.
package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
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
}

type fakeConn struct {
	d       *fakeDomains
	changes chan struct{}
}

func (d *fakeDomains) dial(context.Context, string, string) (agent.DomainConn, error) {
	return &fakeConn{d: d, changes: make(chan struct{})}, nil
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
	var names []string
	for name := range c.d.domains {
		names = append(names, name)
	}
	return names, nil
}
func (d *fakeDomains) set(name string, f func(*agent.Domain)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d.domains[name])
}

type bed struct {
	cp      *controlplane.ControlPlane
	ns      string
	domains *fakeDomains
	vmis    []*v1alpha1.VirtualMachineInstance
	conns   map[types.UID]net.Conn
	// marks has every change of a VMI's mark the watch sees, in the watch's order.
	marks chan markEvent
}

const node = "bench-node"

// setUp starts a control plane, an agent for node with n running VMIs, and a notify connection
// per VMI, as each launcher would hold.
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

	t := &bed{cp: cp, ns: ns.Name, domains: &fakeDomains{domains: map[string]*agent.Domain{}}, conns: map[types.UID]net.Conn{}, marks: make(chan markEvent, 1024)}
	runDir, err := os.MkdirTemp("", "lbb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(runDir) })
	domainsDir := filepath.Join(runDir, "domains")
	for i := range n {
		vmi, err := cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns.Name).Create(ctx, &v1alpha1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vm-%d", i)},
			Spec:       v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), Boot: v1alpha1.BootSource{Kernel: "/k"}},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIScheduled, node
		if vmi, err = cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns.Name).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		t.domains.domains[domain.DomainName(vmi.Namespace, vmi.Name)] = &agent.Domain{State: agent.DomainRunning}
		// The agent finds launchers by their libvirt socket.
		dir := filepath.Join(domainsDir, string(vmi.UID))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		l, err := net.Listen("unix", filepath.Join(dir, contract.LibvirtSocket))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		t.vmis = append(t.vmis, vmi)
	}

	if err := v1alpha1.AddToScheme(scheme.Scheme); err != nil {
		b.Fatal(err)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cp.Kube.CoreV1().Events("")})
	b.Cleanup(broadcaster.Shutdown)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	informers := lifeboatinformers.NewSharedInformerFactoryWithOptions(cp.Lifeboat, 0, lifeboatinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "status.nodeName=" + node
	}))
	configInformers := lifeboatinformers.NewSharedInformerFactory(cp.Lifeboat, 0)
	a, err := agent.New(agent.Config{
		NodeName: node, DomainsDir: domainsDir, Dial: t.domains.dial,
		Configs:           configInformers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(),
		MaxPodGracePeriod: ptrTo[int64](300),
		Recorder:          broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lifeboat-agent"}),
		Metrics:           agent.NewMetrics(reg), Log: log,
	}, cp.Lifeboat, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), configInformers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{configInformers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		b.Fatal(err)
	}
	// As the agent does for each launcher pod: a notify socket in each launcher's directory.
	server := notifyserver.New([]uint32{uint32(os.Getuid())}, a.HandleNotify, reg, log)
	for _, vmi := range t.vmis {
		go func() {
			_ = server.Serve(ctx, filepath.Join(domainsDir, string(vmi.UID), contract.NotifySocketName),
				notify.VMIRef{Namespace: vmi.Namespace, Name: vmi.Name, UID: string(vmi.UID)})
		}()
	}
	informers.Start(ctx.Done())
	configInformers.Start(ctx.Done())
	go func() { _ = a.Run(ctx, 4) }()

	// The benchmark sees marks the way the evacuation controller will: through a watch.
	w, err := cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns.Name).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	running := map[types.UID]bool{}
	for ev := range w.ResultChan() {
		v, ok := ev.Object.(*v1alpha1.VirtualMachineInstance)
		if !ok || ev.Type != watch.Modified || v.Status.Phase != v1alpha1.VMIRunning {
			continue
		}
		running[v.UID] = true
		if len(running) == n {
			break
		}
	}
	go func() {
		for ev := range w.ResultChan() {
			if v, ok := ev.Object.(*v1alpha1.VirtualMachineInstance); ok {
				t.marks <- markEvent{uid: v.UID, marked: v.Status.EvacuationNodeName == node}
			}
		}
	}()

	for _, vmi := range t.vmis {
		// The notify socket exists a moment after Serve starts.
		notifyPath := filepath.Join(domainsDir, string(vmi.UID), contract.NotifySocketName)
		var c net.Conn
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			var dialErr error
			c, dialErr = net.Dial("unix", notifyPath)
			return dialErr == nil, nil
		})
		if err != nil {
			b.Fatalf("the agent's notify socket %s accepted no connection within 10s", notifyPath)
		}
		b.Cleanup(func() { c.Close() })
		if err := notify.Write(c, &notify.Message{Kind: notify.KindHello, VMI: ref(vmi), Time: time.Now()}); err != nil {
			b.Fatal(err)
		}
		t.conns[vmi.UID] = c
	}
	return t
}

func ref(v *v1alpha1.VirtualMachineInstance) notify.VMIRef {
	return notify.VMIRef{Namespace: v.Namespace, Name: v.Name, UID: string(v.UID)}
}

func ptrTo[T any](v T) *T { return &v }

// signal does what a launcher does on SIGTERM (record the signal in its domain, report it) and
// returns the time until the mark is visible in a watch.
func (t *bed) signal(b *testing.B, vmi *v1alpha1.VirtualMachineInstance) time.Duration {
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	start := time.Now()
	deadline := start.Add(45 * time.Second)
	t.domains.set(name, func(d *agent.Domain) { d.GracefulShutdown, d.PodDeadline = &start, &deadline })
	if err := notify.Write(t.conns[vmi.UID], &notify.Message{Kind: notify.KindGracefulShutdown, VMI: ref(vmi), Time: start, PodGracePeriodSeconds: 45}); err != nil {
		b.Fatal(err)
	}
	t.await(b, vmi, true)
	return time.Since(start)
}

// markEvent is a VMI as a watch event showed it: marked for evacuation from the node or not.
type markEvent struct {
	uid    types.UID
	marked bool
}

// await waits until the watch shows vmi marked (or not), skipping what it showed before: the
// agent's writes after the mark (its conditions) show the mark again, and without unmark's wait
// for the mark's removal those would be taken for the next signal's mark.
func (t *bed) await(b *testing.B, vmi *v1alpha1.VirtualMachineInstance, marked bool) {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-t.marks:
			if e.uid == vmi.UID && e.marked == marked {
				return
			}
		case <-timeout:
			b.Fatalf("the watch did not show %s with marked=%v within 10s", vmi.Name, marked)
		}
	}
}

// unmark takes the signal and the mark back, so the VMI can be signalled again.
func (t *bed) unmark(b *testing.B, vmi *v1alpha1.VirtualMachineInstance) {
	t.domains.set(domain.DomainName(vmi.Namespace, vmi.Name), func(d *agent.Domain) { d.GracefulShutdown, d.PodDeadline = nil, nil })
	patch := []byte(`{"status":{"evacuationNodeName":null,"evacuationDeadline":null,"conditions":null}}`)
	if _, err := t.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Patch(context.Background(), vmi.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		b.Fatal(err)
	}
	t.await(b, vmi, false)
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
// It reports p50 and p99 in milliseconds and the ratio of the p99s.
func BenchmarkMarkLatency(b *testing.B) {
	for _, vms := range []int{1, 50} {
		b.Run(fmt.Sprintf("vms=%d", vms), func(b *testing.B) {
			t := setUp(b, vms)
			for b.Loop() {
				var marks, patches []time.Duration
				for i := range *signals {
					vmi := t.vmis[i%len(t.vmis)]
					marks = append(marks, t.signal(b, vmi))
					t.unmark(b, vmi)
					patches = append(patches, t.bareStatusPatch(b, vmi, i))
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
