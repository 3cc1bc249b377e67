package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

func vmiNamed(uid, node string, phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: types.UID(uid)}}
	v.Status.Phase, v.Status.NodeName = phase, node
	return v
}

func TestDecideStray(t *testing.T) {
	movedHere := vmiNamed("old", "node-2", v1alpha1.VMIRunning)
	movedHere.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-2", TargetNode: "node-1", Failed: true}
	movedAway := vmiNamed("old", "node-2", v1alpha1.VMIRunning)
	movedAway.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2", Completed: true}
	failed := vmiNamed("old", "node-1", v1alpha1.VMIFailed)
	failed.Status.Reason = "NodeOutOfService"
	for _, tc := range []struct {
		name        string
		s           Stray
		wantDestroy bool
		wantReason  string
		wantMessage string
	}{
		{name: "the VMI is gone", s: Stray{Domain: DomainRunning}, wantDestroy: true, wantReason: StrayVMIGone, wantMessage: "the VMI no longer exists"},
		{name: "the VM runs a new instance elsewhere", s: Stray{Domain: DomainRunning, VMI: vmiNamed("new", "node-2", v1alpha1.VMIRunning)},
			wantDestroy: true, wantReason: StrayVMIReplaced, wantMessage: "VMI ns/vm is now another instance (UID new, Running, on node node-2)"},
		{name: "a new instance not yet on a node", s: Stray{Domain: DomainRunning, VMI: vmiNamed("new", "", v1alpha1.VMIPending)},
			wantDestroy: true, wantReason: StrayVMIReplaced, wantMessage: "not yet on a node"},
		{name: "a paused guest is a copy too", s: Stray{Domain: DomainPaused, VMI: vmiNamed("new", "node-2", v1alpha1.VMIRunning)},
			wantDestroy: true, wantReason: StrayVMIReplaced},
		{name: "the VMI failed (out of service)", s: Stray{Domain: DomainRunning, VMI: failed},
			wantDestroy: true, wantReason: StrayVMIEnded, wantMessage: "VMI ns/vm is Failed (NodeOutOfService)"},
		{name: "the VMI runs on another node, moved there by a migration from here", s: Stray{Domain: DomainRunning, VMI: movedAway},
			wantDestroy: true, wantReason: StrayVMIElsewhere, wantMessage: "runs on node node-2"},
		{name: "the VMI runs on another node without a migration", s: Stray{Domain: DomainRunning, VMI: vmiNamed("old", "node-2", v1alpha1.VMIRunning)},
			wantDestroy: true, wantReason: StrayVMIElsewhere},
		{name: "this node was a migration's target: its clean-up is the migration's", s: Stray{Domain: DomainPaused, VMI: movedHere}},
		{name: "a migration from or to here runs", s: Stray{Domain: DomainPaused, VMI: vmiNamed("old", "node-2", v1alpha1.VMIRunning), Migrating: true}},
		{name: "the guest is this node's (the cache is behind)", s: Stray{Domain: DomainRunning, VMI: vmiNamed("old", "node-1", v1alpha1.VMIRunning)}},
		{name: "the VMI has no node yet, and the guest is its", s: Stray{Domain: DomainRunning, VMI: vmiNamed("old", "", v1alpha1.VMIScheduling)}},
		{name: "nothing runs", s: Stray{Domain: DomainShutoff}},
		{name: "a crashed guest runs no more", s: Stray{Domain: DomainCrashed, VMI: vmiNamed("new", "node-2", v1alpha1.VMIRunning)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.UID, tc.s.Node = "old", "node-1"
			destroy, reason, msg := DecideStray(tc.s)
			if destroy != tc.wantDestroy || reason != tc.wantReason {
				t.Fatalf("DecideStray() = %v, %q (%s); want %v, %q", destroy, reason, msg, tc.wantDestroy, tc.wantReason)
			}
			if !strings.Contains(msg, tc.wantMessage) {
				t.Errorf("message %q lacks %q", msg, tc.wantMessage)
			}
			if destroy && !strings.Contains(msg, "still ran on node node-1") {
				t.Errorf("message %q must say where the guest ran", msg)
			}
		})
	}
}

func TestContact(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type probe struct {
		at   int
		ok   bool
		want ContactChange
	}
	for _, tc := range []struct {
		name       string
		probes     []probe
		wantOutage Outage
	}{
		{name: "steady contact: nothing", probes: []probe{{10, true, ContactSame}, {20, true, ContactSame}}},
		{name: "a short failure: nothing", probes: []probe{{10, false, ContactSame}, {20, false, ContactSame}, {30, true, ContactSame}}},
		{name: "cut off past the limit, then back", probes: []probe{
			{10, true, ContactSame}, {20, false, ContactSame}, {70, false, ContactSame}, {80, false, ContactLost}, {90, false, ContactSame}, {100, true, ContactBack}},
			wantOutage: Outage{From: at(10), To: at(100)}},
		{name: "the agent did not run (frozen), then reaches the API server", probes: []probe{{10, true, ContactSame}, {310, true, ContactBack}, {320, true, ContactSame}},
			wantOutage: Outage{From: at(10), To: at(310), Stopped: true}},
		{name: "frozen, then cut off: lost at once, and back later", probes: []probe{{10, true, ContactSame}, {310, false, ContactLost}, {320, true, ContactBack}},
			wantOutage: Outage{From: at(10), To: at(320)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewContact(time.Minute, t0)
			for _, p := range tc.probes {
				if got := c.Probed(at(p.at), p.ok); got != p.want {
					t.Fatalf("probe at %ds (ok %v) = %v, want %v", p.at, p.ok, got, p.want)
				}
			}
			if c.Outage != tc.wantOutage {
				t.Errorf("outage %+v, want %+v", c.Outage, tc.wantOutage)
			}
		})
	}
	msg := Outage{From: t0, To: at(300), Stopped: true}.Message("node-1", 2)
	for _, part := range []string{"node node-1 did not run", "(5m0s)", "paused nothing and killed nothing", "checks the 2 guest(s)"} {
		if !strings.Contains(msg, part) {
			t.Errorf("outage message %q lacks %q", msg, part)
		}
	}
}

// strayLibvirt is a launcher's libvirt with one domain, which Destroy ends.
type strayLibvirt struct {
	mu        sync.Mutex
	name      string
	state     DomainState
	destroyed int
}

func (l *strayLibvirt) Observe(_ context.Context, name string) (*Domain, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if name != l.name {
		return nil, nil
	}
	return &Domain{State: l.state}, nil
}
func (l *strayLibvirt) DomainNames(context.Context) ([]string, error) { return []string{l.name}, nil }
func (l *strayLibvirt) Changes() <-chan struct{}                      { return nil }
func (l *strayLibvirt) Shutdown(context.Context, string) error        { return errors.New("not expected") }
func (l *strayLibvirt) Destroy(_ context.Context, name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.destroyed++
	l.state = DomainShutoff
	return nil
}
func (l *strayLibvirt) Close() error { return nil }

// strayAgent is an agent on node-1 with a launcher for the VMI UID "old", whose guest runs, and
// the API server holding objs.
func strayAgent(t *testing.T, objs ...runtime.Object) (*Agent, *lifeboatfake.Clientset, *strayLibvirt, *record.FakeRecorder, *Metrics) {
	t.Helper()
	client := lifeboatfake.NewSimpleClientset(objs...)
	recorder := record.NewFakeRecorder(10)
	metrics := NewMetrics(prometheus.NewRegistry())
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	a, err := New(Config{NodeName: "node-1", Recorder: recorder, Metrics: metrics, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		DomainsDir: t.TempDir(), Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister()},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	libvirt := &strayLibvirt{name: "ns_vm", state: DomainRunning}
	a.launchers["old"] = &launcher{conn: libvirt}
	return a, client, libvirt, recorder, metrics
}

// A node that comes back after its VM was restarted elsewhere: its agent's cache no longer holds
// the VMI (the instance it ran was deleted, and a new one of the same name runs on node-2), and
// the guest still runs here. The agent reads the VMI live and destroys the guest, with an Event
// on the instance it was, and the metric.
func TestTheAgentDestroysAGuestWhoseVMRunsElsewhere(t *testing.T) {
	a, _, libvirt, recorder, metrics := strayAgent(t, vmiNamed("new", "node-2", v1alpha1.VMIRunning))
	if _, err := a.sync(context.Background(), "old"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if libvirt.destroyed != 1 {
		t.Fatalf("the guest was destroyed %d times, want once", libvirt.destroyed)
	}
	if got := testutil.ToFloat64(metrics.StrayGuestsDestroyed.WithLabelValues(StrayVMIReplaced)); got != 1 {
		t.Errorf("lifeboat_agent_stray_guests_destroyed_total{reason=VMIReplaced} = %v, want 1", got)
	}
	select {
	case e := <-recorder.Events:
		if !strings.Contains(e, ReasonStrayGuestDestroyed) || !strings.Contains(e, "UID new") {
			t.Errorf("event %q: want %s naming the new instance", e, ReasonStrayGuestDestroyed)
		}
	default:
		t.Error("want an Event")
	}
	// Once destroyed, nothing more happens.
	if _, err := a.sync(context.Background(), "old"); err != nil || libvirt.destroyed != 1 {
		t.Errorf("a second look: %v, destroyed %d times", err, libvirt.destroyed)
	}
}

// While the API server does not answer, the agent destroys nothing on what it last knew: the
// sync fails, to be retried, and the guest runs on.
func TestACutOffAgentKillsNothing(t *testing.T) {
	a, client, libvirt, recorder, _ := strayAgent(t)
	client.PrependReactor("*", "*", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	})
	if _, err := a.sync(context.Background(), "old"); err == nil {
		t.Error("sync without an API server: want an error, to retry")
	}
	if libvirt.destroyed != 0 || len(recorder.Events) != 0 {
		t.Errorf("cut off, the agent destroyed the guest %d times and recorded %d Events; want none", libvirt.destroyed, len(recorder.Events))
	}
}

// A migration to this node whose VMI the target's cache does not hold yet is not a stray.
func TestAnIncomingMigrationIsNotAStray(t *testing.T) {
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", Labels: map[string]string{v1alpha1.LabelVMIUID: "old"}}}
	mig.Status.Phase, mig.Status.SourceNode, mig.Status.TargetNode = v1alpha1.MigrationRunning, "node-2", "node-1"
	a, _, libvirt, _, _ := strayAgent(t, vmiNamed("old", "node-2", v1alpha1.VMIRunning), mig)
	libvirt.state = DomainPaused
	if _, err := a.sync(context.Background(), "old"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if libvirt.destroyed != 0 {
		t.Error("the target of a running migration was destroyed")
	}
}

// The running agent sees its VMI leave the node (the instance deleted, and a new one of the same
// name made on node-2, as a VM's run strategy does once the node was declared off) and destroys
// the guest that still runs here, without a restart or a launcher event to prompt it.
func TestARunningAgentDestroysTheGuestOfAReplacedVMI(t *testing.T) {
	old := vmiNamed("old", "node-1", v1alpha1.VMIRunning)
	client := lifeboatfake.NewSimpleClientset(old)
	recorder := record.NewFakeRecorder(100)
	metrics := NewMetrics(prometheus.NewRegistry())
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	root := t.TempDir()
	fakeLaunchers(t, root)("old")
	libvirt := &strayLibvirt{name: "ns_vm", state: DomainRunning}
	dial := func(_ context.Context, _, uid string) (DomainConn, error) {
		if uid != "old" {
			return nil, errors.New("no such launcher")
		}
		return libvirt, nil
	}
	a, err := New(Config{NodeName: "node-1", DomainsDir: root, Dial: dial, Recorder: recorder, Metrics: metrics,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister()},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	informers.Start(ctx.Done())
	go func() { _ = a.Run(ctx, 1) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("want %s within 10s", what)
		}
	}
	waitFor("the agent connected to the launcher", func() bool { return a.connected("old") })
	// Running as it should: nothing destroyed.
	kubewait.Consistently(t, time.Second, "no guest destroyed while its VMI runs on this node", func(context.Context) error {
		libvirt.mu.Lock()
		defer libvirt.mu.Unlock()
		if libvirt.destroyed != 0 {
			return errors.New("the guest of a VMI running on this node was destroyed")
		}
		return nil
	})

	vmis := client.LifeboatV1alpha1().VirtualMachineInstances("ns")
	if err := vmis.Delete(ctx, "vm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := vmis.Create(ctx, vmiNamed("new", "node-2", v1alpha1.VMIRunning), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the stray guest destroyed", func() bool {
		libvirt.mu.Lock()
		defer libvirt.mu.Unlock()
		return libvirt.destroyed == 1
	})
	// Read between the deletion and the new instance's creation, the VMI is gone rather than
	// replaced: either says why the guest went, once.
	waitFor("the metric", func() bool {
		return testutil.ToFloat64(metrics.StrayGuestsDestroyed.WithLabelValues(StrayVMIReplaced))+
			testutil.ToFloat64(metrics.StrayGuestsDestroyed.WithLabelValues(StrayVMIGone)) == 1
	})
}

// A launcher whose domain is named for a VMI of another namespace than its pod's is not taken at
// its word: nothing is read or destroyed on that name.
func TestAStrayCheckTrustsThePodsNamespaceOverTheDomainsName(t *testing.T) {
	a, _, libvirt, recorder, _ := strayAgent(t)
	libvirt.name = "victim_vm"
	a.links["old"] = RecordedPod{Namespace: "ns", Name: "launcher-vm-abcde", UID: "pod-uid"}
	if _, err := a.sync(context.Background(), "old"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if libvirt.destroyed != 0 || len(recorder.Events) != 0 {
		t.Errorf("acted on a domain name outside the pod's namespace: destroyed %d, %d Events", libvirt.destroyed, len(recorder.Events))
	}
}

// An agent cut off from the API server for longer than APILostAfter says so in its metric, and
// once back reports the outage as an Event on its Node and counts it.
func TestTheAgentReportsAnOutageOnItsReturn(t *testing.T) {
	a, client, libvirt, recorder, metrics := strayAgent(t)
	a.cfg.APILostAfter = time.Second
	var mu sync.Mutex
	cut := true
	client.PrependReactor("get", "lifeboatconfigs", func(clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if cut {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); a.runContact(ctx) }()
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return testutil.ToFloat64(metrics.APIServerCutOff) == 1, nil
	}); err != nil {
		t.Fatal("lifeboat_agent_api_server_cut_off did not read 1 within 10s of an outage")
	}
	if len(recorder.Events) != 0 || libvirt.destroyed != 0 {
		t.Errorf("cut off, the agent recorded %d Events and destroyed %d guests", len(recorder.Events), libvirt.destroyed)
	}
	mu.Lock()
	cut = false
	mu.Unlock()
	select {
	case e := <-recorder.Events:
		if !strings.Contains(e, ReasonAPIServerContactRestored) || !strings.Contains(e, "could not reach the API server") ||
			!strings.Contains(e, "paused nothing and killed nothing") || !strings.Contains(e, "checks the 1 guest(s)") {
			t.Errorf("event %q: want %s saying what happened", e, ReasonAPIServerContactRestored)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Event within 10s of the API server's return")
	}
	if got := testutil.ToFloat64(metrics.APIServerOutages); got != 1 || testutil.ToFloat64(metrics.APIServerCutOff) != 0 {
		t.Errorf("outages %v, cut off %v; want 1, 0", got, testutil.ToFloat64(metrics.APIServerCutOff))
	}
	cancel()
	<-done
}

// A launcher whose pod's link the agent has no record of (it restarted after the pod went) and
// whose domain is named for another tenant's VMI: its own guest, whose VMI is gone, is destroyed
// all the same (the VMI read by that name has another UID), but the Event goes on the node, not
// on the VMI the launcher named, and nothing of that VMI is written.
func TestAnUnlinkedLauncherPutsNoEventOnTheVMIItNames(t *testing.T) {
	victim := vmiNamed("victim", "node-2", v1alpha1.VMIRunning)
	victim.Namespace = "victims"
	a, client, libvirt, recorder, metrics := strayAgent(t, victim)
	recorder.IncludeObject = true
	libvirt.name = "victims_vm"
	if _, err := a.sync(context.Background(), "old"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if libvirt.destroyed != 1 {
		t.Errorf("the launcher's own guest, whose VMI is gone, was destroyed %d times, want once", libvirt.destroyed)
	}
	if got := testutil.ToFloat64(metrics.StrayGuestsDestroyed.WithLabelValues(StrayVMIReplaced)); got != 1 {
		t.Errorf("lifeboat_agent_stray_guests_destroyed_total{reason=VMIReplaced} = %v, want 1", got)
	}
	select {
	case e := <-recorder.Events:
		if !strings.Contains(e, ReasonStrayGuestDestroyed) || !strings.Contains(e, "kind=Node") || !strings.Contains(e, "whose domain is named victims_vm") {
			t.Errorf("event %q: want %s on the node, naming the domain", e, ReasonStrayGuestDestroyed)
		}
	default:
		t.Error("want an Event")
	}
	for _, action := range client.Actions() {
		if action.GetVerb() != "get" && action.GetVerb() != "list" && action.GetVerb() != "watch" {
			t.Errorf("the agent wrote for a launcher's domain name: %s %s", action.GetVerb(), action.GetResource().Resource)
		}
	}
}

// A launcher whose pod was deleted while the agent held its connection (a node that comes back
// after its pods were force-deleted): the pod it was linked to still says the namespace, and the
// Event goes on the VMI, the instance it was.
func TestAStrayOfADeletedPodIsReportedOnItsVMI(t *testing.T) {
	a, _, libvirt, recorder, _ := strayAgent(t, vmiNamed("new", "node-2", v1alpha1.VMIRunning))
	recorder.IncludeObject = true
	a.setLink("old", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "launcher-vm-abcde", UID: "pod-uid"}})
	a.setLink("old", nil)
	if _, err := a.sync(context.Background(), "old"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if libvirt.destroyed != 1 {
		t.Fatalf("the guest was destroyed %d times, want once", libvirt.destroyed)
	}
	select {
	case e := <-recorder.Events:
		if !strings.Contains(e, ReasonStrayGuestDestroyed) || !strings.Contains(e, "kind=VirtualMachineInstance") {
			t.Errorf("event %q: want %s on the VMI", e, ReasonStrayGuestDestroyed)
		}
	default:
		t.Error("want an Event")
	}
}
