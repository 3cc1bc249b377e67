package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

const uidIndex = "uid"

// maxSocketPath is the longest path a unix socket address holds (sun_path is 108 bytes with its NUL).
const maxSocketPath = 107

// Config is what an agent needs to know of its node.
type Config struct {
	NodeName string
	// DomainsDir holds one directory per launcher, named by VMI UID (/var/run/lifeboat/domains).
	DomainsDir string
	Dial       Dialer
	// Configs lists LifeboatConfigs (the one named cluster holds the feature gates).
	Configs lifeboatlisters.LifeboatConfigLister
	// NodeAddress is where this node's migration proxies listen for other nodes.
	NodeAddress string
	// Certificates is this node's migration certificate and the CA its peers' must chain to
	// (agent/nodecert): migration streams between nodes are TLS with both ends checked.
	Certificates migrationtls.Certificates
	// MaxPodGracePeriod is the node's kubelet evictionMaxPodGracePeriod in seconds; nil if unknown.
	MaxPodGracePeriod *int64
	Recorder          record.EventRecorder
	Metrics           *Metrics
	Log               *slog.Logger
	// Now is the clock; nil means time.Now. Clock runs a migration's timers (its convergence
	// loop's ticks, the wait for the launcher's last report); nil means the real clock.
	Now   func() time.Time
	Clock clock.WithTicker
	// LauncherExit reads the exit code of the launcher in pod namespace/name with podUID on this
	// node, nil while it runs; a restarted agent uses it to learn how a migration it lost track
	// of ended.
	LauncherExit func(ctx context.Context, namespace, name string, podUID types.UID) (*int32, error)
	// GetPod reads a pod from the API server (a migration's source and target pods, for their
	// addresses); nil: a source pod never forwards to its target (handover.go).
	GetPod func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// EndpointSlices lists a namespace's EndpointSlices, to end a source pod's forward once
	// none lists it; nil: a forward lasts ForwardAtMost.
	EndpointSlices func(ctx context.Context, namespace string) ([]discoveryv1.EndpointSlice, error)
	// PodInformer, if set, holds this node's launcher pods: the agent links each VMI's directory
	// to its pod's run volume (poddirs.go), and a pod deleted through the API gives its SIGTERM
	// its cause and deadline (PodDeletion).
	PodInformer cache.SharedIndexInformer
	// KubeletPodsDir is the kubelet's pods directory (/var/lib/kubelet/pods), where launcher
	// pods' volumes are; PodDirResync is how often every link is checked again.
	KubeletPodsDir string
	PodDirResync   time.Duration
	// Memory reads the node's memory.available signal (pressure.ReadMemory); nil turns
	// node-pressure relief off. Thresholds are the kubelet's, and PodWorkingSet reads a pod's
	// working set by UID (pressure.PodWorkingSet), false when it cannot.
	Memory        func() (pressure.Memory, error)
	Thresholds    pressure.Thresholds
	PodWorkingSet func(podUID string) (uint64, bool)
	// NodeSwap reads the node's swap space (pressure.SwapTotal). Only where it reads none does
	// a guest's resident memory bound what a migration's first pass counts in use; nil counts
	// it all.
	NodeSwap func() (uint64, error)
	// LabelNode sets (true) or removes (false) the node's label LabelMemoryPressureRelief, which
	// keeps migrations from targeting it while relief finds it short of memory.
	LabelNode func(ctx context.Context, relieving bool) error
	// KubeletSource says where MaxPodGracePeriod and Thresholds came from (KubeletSourceConfigz,
	// KubeletSourceFile, KubeletSourceDefaults), and PublishExposure sets the node's
	// AnnotationEvictionExposure: what they mean for the node's VMs.
	KubeletSource   string
	PublishExposure func(ctx context.Context, e v1alpha1.NodeEvictionExposure) error
	// ServeNotify serves a launcher's notify socket at path, for the VMI vmi (its namespace and
	// name as lifeboat recorded them, with its UID), until ctx ends (notifyserver.Server.Serve).
	ServeNotify func(ctx context.Context, path string, vmi notify.VMIRef) error
	// TellLauncher writes m to the launcher of the VMI with vmiUID, if it is connected
	// (notifyserver.Server.Tell); nil tells nothing.
	TellLauncher func(vmiUID string, m *notify.Message) bool
	// APILostAfter is how long without reaching the API server (or without running) counts as
	// cut off: the agent probes it, and once contact is back reports the outage and checks
	// every guest against its VMI (apicontact.go). 0 probes nothing.
	APILostAfter time.Duration
}

// Agent keeps the status of the VMIs on its node true and ends their guests as decided.
type Agent struct {
	cfg      Config
	lifeboat lifeboatclient.Interface
	informer cache.SharedIndexInformer
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string] // VMI UIDs

	mu        sync.Mutex
	launchers map[string]*launcher // by VMI UID
	// stalls counts, by VMI UID, the times a launcher's libvirt did not answer in time; it is
	// forgotten with the launcher's directory.
	stalls map[string]int

	migrations *migrations
	// migratedAway holds, by VMI UID, when a launcher reported its guest left by migration; it is
	// forgotten a while after the launcher's directory goes.
	migratedAway sync.Map
	// handovers holds, by VMI UID, the migrations away whose source pod this agent will tell
	// when it is no longer needed (releaseSource); a launcher whose guest left without one (the
	// agent restarted since) is told at once.
	handovers sync.Map
	// arrived holds, by VMI UID, the time of the last Migrated report counted: a launcher
	// repeats its reports on each new connection, and each arrival counts once.
	arrived sync.Map
	// libvirtdRestarts holds, by VMI UID, the LibvirtdRestarted reports counted (restartReports).
	libvirtdRestarts sync.Map
	// guestMemory holds, by VMI UID, the channel where a question to the launcher about its
	// guest's memory awaits the answer (guestmemory.go).
	guestMemory sync.Map
	// reportLogs holds, by VMI UID, the budget of log lines of the launcher's reports (mayLogReport).
	reportLogs sync.Map
	// dials holds, by VMI UID, what the launcher's recent connections did (dialgate.go); under mu.
	dials map[string]*dialGate
	// notifyConns says whether a launcher's reports have all been read.
	notifyConns *notifyConns
	// relieving is the node's LabelMemoryPressureRelief as this agent last set it; nil until it has.
	// Only the relief goroutine uses it.
	relieving *bool
	// links holds, by VMI UID, the pod its directory links to (poddirs.go); unlinked, the pod it
	// linked to before its link went (the pod was deleted) while the agent still holds a
	// connection to its launcher: a stray guest's namespace is known from it (stray.go).
	linksMu  sync.Mutex
	links    map[string]RecordedPod
	unlinked map[string]RecordedPod
	// exposed is the node's AnnotationEvictionExposure as this agent last set it; nil until it
	// has. Only the relief goroutine uses it.
	exposed *v1alpha1.NodeEvictionExposure
	// signalled holds, by VMI UID, the SIGTERM a launcher reported (a *signal), which its domain's
	// metadata may not show yet: libvirt holds that write while a migration runs.
	signalled sync.Map
	// netns holds, by VMI UID, the network namespace of the launcher pod whose network this
	// agent built, for the forward at the end of a migration away (handover.go).
	netnsMu sync.Mutex
	netns   map[string]*os.File
}

// launcher is the agent's link to one launcher.
type launcher struct {
	conn         DomainConn
	shutdownSent bool
	// warmed: its guest's dirty rate was sampled once (WarmDirtyRate).
	warmed bool
}

// New makes an agent. The VMI informer must list the VMIs whose status.nodeName is this node;
// the migration informers list the migrations whose status.sourceNode is this node and those
// whose status.targetNode is (a field selector cannot say "or").
func New(cfg Config, lb lifeboatclient.Interface, vmis lifeboatinformers.VirtualMachineInstanceInformer, configs lifeboatinformers.LifeboatConfigInformer,
	migrationInformers []lifeboatinformers.VirtualMachineInstanceMigrationInformer) (*Agent, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry()) // counted, served nowhere
	}
	a := &Agent{
		cfg: cfg, lifeboat: lb, informer: vmis.Informer(),
		queue:     workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "agent"}),
		launchers: map[string]*launcher{}, stalls: map[string]int{}, dials: map[string]*dialGate{}, notifyConns: newNotifyConns(), links: map[string]RecordedPod{}, unlinked: map[string]RecordedPod{},
	}
	if err := a.informer.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		return []string{string(obj.(metav1.Object).GetUID())}, nil
	}}); err != nil {
		return nil, err
	}
	if _, err := a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.enqueueVMI,
		UpdateFunc: func(_, obj any) { a.enqueueVMI(obj) },
		// A VMI deleted, replaced or moved to another node (it leaves the informer's field
		// selector): a guest of it still running here is a stray (syncStray).
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if o, ok := obj.(metav1.Object); ok && a.connected(string(o.GetUID())) {
				a.queue.Add(string(o.GetUID()))
			}
		},
	}); err != nil {
		return nil, err
	}
	a.migrations = a.newMigrations(lb, migrationInformers, cfg.NodeAddress)
	// A feature gate turned on while a launcher waits must take effect for it.
	a.synced = []cache.InformerSynced{a.informer.HasSynced, configs.Informer().HasSynced}
	_, err := configs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.enqueueAll() },
		UpdateFunc: func(_, _ any) { a.enqueueAll() },
		DeleteFunc: func(any) { a.enqueueAll() },
	})
	if err != nil || cfg.PodInformer == nil {
		return a, err
	}
	// A pod's deletion may reach the agent after its launcher's report of the SIGTERM.
	a.synced = append(a.synced, cfg.PodInformer.HasSynced)
	_, err = cfg.PodInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*corev1.Pod); ok && p.Labels[v1alpha1.LabelVMIUID] != "" {
				a.queue.Add(p.Labels[v1alpha1.LabelVMIUID])
			}
		},
	})
	return a, err
}

// podDeletion is the deletion through the API of the VMI's launcher pod on this node, nil if
// there is none (or no pod informer).
func (a *Agent) podDeletion(vmi *v1alpha1.VirtualMachineInstance) *PodDeletion {
	p, ok := a.linkedPod(string(vmi.UID))
	if !ok || p.DeletionTimestamp == nil {
		return nil
	}
	d := &PodDeletion{Deadline: p.DeletionTimestamp.Time}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			d.DisruptionReason = c.Reason
		}
	}
	return d
}

func (a *Agent) enqueueAll() {
	for _, obj := range a.informer.GetStore().List() {
		a.enqueueVMI(obj)
	}
}

// eviction is what Decide needs to know of the eviction settings now.
func (a *Agent) eviction() Eviction {
	ev := Eviction{MaxPodGracePeriod: a.cfg.MaxPodGracePeriod}
	if c, err := a.cfg.Configs.Get(v1alpha1.ConfigName); err == nil {
		ev.Config = c
	}
	return ev
}

func (a *Agent) enqueueVMI(obj any) {
	if o, ok := obj.(metav1.Object); ok {
		a.queue.Add(string(o.GetUID()))
	}
}

// HandleNotify is the notify server's handler: a launcher's report makes the agent look again at once.
func (a *Agent) HandleNotify(m *notify.Message, peerPID int32) {
	if m.Kind == notify.KindGuestMemory {
		// An answer, not a report: a migration's loop asked, and nothing else changed.
		a.guestMemoryAnswered(m)
		return
	}
	if a.mayLogReport(m.VMI.UID) {
		a.cfg.Log.Info("launcher report", "kind", m.Kind, "vmi", m.VMI.String(), "peerPID", peerPID, "reason", boundedText(m.Reason))
	}
	if m.Kind == notify.KindDomainGone && m.Reason == notify.ReasonMigrated {
		a.migratedAway.Store(m.VMI.UID, m.Time)
		if _, held := a.handovers.Load(m.VMI.UID); !held {
			go a.tellHandoverDone(m.VMI, "this agent holds no forward for the pod")
		}
	}
	if m.Kind == notify.KindMigrated {
		if last, ok := a.arrived.Swap(m.VMI.UID, m.Time); !ok || !last.(time.Time).Equal(m.Time) {
			a.cfg.Metrics.MigrationDowntime.Observe((time.Duration(m.DowntimeMilliseconds) * time.Millisecond).Seconds())
		}
		go a.migrations.recordDowntime(m.VMI, m.Time, time.Duration(m.DowntimeMilliseconds)*time.Millisecond)
	}
	if m.Kind == notify.KindLibvirtdRestarted {
		a.libvirtdRestarted(m)
	}
	if m.Kind == notify.KindHello {
		a.notifyConns.opened(m.VMI.UID)
	}
	if m.Kind == notify.KindDomainStarted {
		go a.migrations.targetDomainReady(m.VMI)
	}
	if m.Kind == notify.KindGracefulShutdown {
		a.signalled.Store(m.VMI.UID, &signal{at: m.Time, deadline: m.Time.Add(time.Duration(m.PodGracePeriodSeconds) * time.Second)})
	}
	a.queue.Add(m.VMI.UID)
}

// A launcher's reports are its tenant's to write (kubectl exec): each is logged, with at most
// maxLoggedText bytes of its text, within a budget per launcher of reportLogRate a second
// (bursts of reportLogBurst), so that no launcher rotates the others' lines out of the agent's
// log. Reports beyond it are handled all the same, and counted.
const (
	maxLoggedText  = 256
	reportLogRate  = 2
	reportLogBurst = 20
)

// mayLogReport takes one from the log budget of the launcher of the VMI with uid.
func (a *Agent) mayLogReport(uid string) bool {
	l, _ := a.reportLogs.LoadOrStore(uid, rate.NewLimiter(reportLogRate, reportLogBurst))
	if l.(*rate.Limiter).Allow() {
		return true
	}
	a.cfg.Metrics.LauncherReportsUnlogged.Inc()
	return false
}

// boundedText is s cut to maxLoggedText bytes, saying so.
func boundedText(s string) string {
	if len(s) <= maxLoggedText {
		return s
	}
	return strings.ToValidUTF8(s[:maxLoggedText], "") + fmt.Sprintf("… (%d bytes more)", len(s)-maxLoggedText)
}

// ReasonLibvirtdRestarted is the Warning Event on a VMI whose launcher restarted its libvirtd.
const ReasonLibvirtdRestarted = "LibvirtdRestarted"

// A launcher restarts its libvirtd at most maxLibvirtdRestarts times in libvirtdRestartWindow
// (launcher/daemon.go) and then fails: reports beyond that, by the agent's clock, are a
// launcher's own invention, and are dropped rather than counted or recorded.
const (
	maxLibvirtdRestarts   = 5
	libvirtdRestartWindow = 10 * time.Minute
)

// restartReports are the LibvirtdRestarted reports of one launcher that were counted: the last
// report's own time, so that a report repeated on a new connection counts once, and when the
// agent counted each within the window.
type restartReports struct {
	mu      sync.Mutex
	last    time.Time
	counted []time.Time
}

// libvirtdRestarted counts a launcher's report that it restarted its libvirtd and records it on
// the VMI, in the agent's own words: the report's text is the launcher's, which a tenant may write.
func (a *Agent) libvirtdRestarted(m *notify.Message) {
	v, _ := a.libvirtdRestarts.LoadOrStore(m.VMI.UID, &restartReports{})
	r := v.(*restartReports)
	now := a.cfg.Clock.Now()
	r.mu.Lock()
	if !m.Time.After(r.last) {
		r.mu.Unlock()
		return
	}
	r.last = m.Time
	recent := r.counted[:0]
	for _, at := range r.counted {
		if now.Sub(at) < libvirtdRestartWindow {
			recent = append(recent, at)
		}
	}
	r.counted = recent
	over := len(r.counted) >= maxLibvirtdRestarts
	if !over {
		r.counted = append(r.counted, now)
	}
	n := len(r.counted)
	r.mu.Unlock()
	if over {
		a.cfg.Metrics.LibvirtdRestartReportsDropped.Inc()
		if !a.mayLogReport(m.VMI.UID) {
			return
		}
		a.cfg.Log.Warn("a launcher reported more libvirtd restarts than a launcher makes; the report is dropped",
			"vmi", m.VMI.String(), "max", maxLibvirtdRestarts, "window", libvirtdRestartWindow)
		return
	}
	a.cfg.Metrics.LauncherLibvirtdRestarts.Inc()
	if vmi := a.cachedVMI(m.VMI.UID); vmi != nil {
		a.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonLibvirtdRestarted,
			"On node %s: the launcher's libvirtd exited and the launcher started it again (%d time(s) in the last %s); the guest ran on", a.cfg.NodeName, n, libvirtdRestartWindow)
	}
}

// migratedAwaySince reports whether the VMI's launcher said its guest left by migration at or
// after start.
func (a *Agent) migratedAwaySince(uid string, start time.Time) bool {
	at, ok := a.migratedAway.Load(uid)
	return ok && !at.(time.Time).Before(start)
}

// HandleNotifyEnd is the notify server's end handler: the launcher's reports have all been read.
func (a *Agent) HandleNotifyEnd(vmiUID string) {
	a.notifyConns.ended(vmiUID)
}

// Run discovers launchers and reconciles until ctx ends.
func (a *Agent) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrash()
	defer a.queue.ShutDown()
	defer a.closeAll()
	if !cache.WaitForCacheSync(ctx.Done(), a.synced...) {
		return errors.New("agent: VMI cache did not sync")
	}
	found, gone := make(chan string), make(chan string)
	errc := make(chan error, 1)
	go func() { errc <- discover(ctx, a.cfg.DomainsDir, found, gone, a.rescanned) }()
	for range workers {
		go wait.UntilWithContext(ctx, a.runWorker, time.Second)
	}
	go a.migrations.run(ctx)
	if a.cfg.Memory != nil {
		go a.runRelief(ctx)
	}
	if a.cfg.APILostAfter > 0 {
		go a.runContact(ctx)
	}
	if a.cfg.PodInformer != nil {
		dirs := &podDirs{a: a, notify: map[string]*notifyServing{}, impostors: map[types.UID]bool{}, volumeWaits: map[string]*volumeWait{}}
		go dirs.run(ctx, a.cfg.PodDirResync)
	}
	a.cfg.Log.Info("agent started", "node", a.cfg.NodeName, "domainsDir", a.cfg.DomainsDir)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case uid := <-found:
			go a.connect(ctx, uid)
		case uid := <-gone:
			a.forget(uid)
			a.dropNetns(uid)
			a.cfg.Metrics.guestDrops.forget(uid)
			a.mu.Lock()
			delete(a.stalls, uid)
			delete(a.dials, uid)
			a.mu.Unlock()
			a.signalled.Delete(uid)
			a.arrived.Delete(uid)
			a.libvirtdRestarts.Delete(uid)
			a.reportLogs.Delete(uid)
			// A migration that just ended may still read what the launcher last reported
			// (leftByMigration waits launcherReportWait for it): forget it after that.
			at, _ := a.migratedAway.Load(uid)
			time.AfterFunc(2*launcherReportWait, func() {
				a.migratedAway.CompareAndDelete(uid, at)
				a.notifyConns.forget(uid)
			})
		}
	}
}

// rescanned records that the launcher watch lost events (err says why) and rescans.
func (a *Agent) rescanned(err error) {
	a.cfg.Metrics.LauncherRescans.Inc()
	a.cfg.Log.Warn("the watch of launcher directories lost events; rescanning them", "dir", a.cfg.DomainsDir, "err", err)
}

// connect dials a launcher's libvirt and feeds its domain's changes to the queue until the
// connection ends.
func (a *Agent) connect(ctx context.Context, uid string) {
	a.mu.Lock()
	if _, ok := a.launchers[uid]; ok {
		a.mu.Unlock()
		return
	}
	if g := a.dials[uid]; g != nil {
		if wait := g.notBefore.Sub(a.cfg.Clock.Now()); wait > 0 {
			a.connectAfter(ctx, uid, g, wait)
			a.mu.Unlock()
			return
		}
	}
	mine := &launcher{}
	a.launchers[uid] = mine
	a.mu.Unlock()

	socket := filepath.Join(a.cfg.DomainsDir, uid, contract.LibvirtSocket)
	if len(socket) > maxSocketPath {
		a.cfg.Log.Error("a launcher's libvirt socket path is longer than a unix socket path may be; shorten --run-dir",
			"vmiUID", uid, "socket", socket, "length", len(socket), "max", maxSocketPath)
		a.forget(uid)
		return
	}
	// One attempt: each starts a libvirt client child. A socket that is there before its daemon
	// answers is tried again after DialDelay, less and less often (connectFailed).
	dialCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	conn, err := a.cfg.Dial(dialCtx, socket, uid)
	cancel()
	if err != nil {
		a.forget(uid)
		if errors.Is(err, context.DeadlineExceeded) {
			a.cfg.Log.Error("a launcher's libvirt took the connection and did not answer", "vmiUID", uid, "socket", socket, "err", err)
			a.launcherStalled(uid, "connect", connectTimeout)
			go a.reconnectLater(ctx, uid)
			return
		}
		if ctx.Err() != nil {
			return
		}
		a.connectFailed(ctx, uid, err.Error())
		return
	}
	// Every call from here on has its deadline and its turn (deadlines.go).
	guard := newGuardedConn(conn, func(call string, deadline time.Duration) { a.launcherStalled(uid, call, deadline) })
	conn = guard
	a.mu.Lock()
	// Ours only: if the directory went away while we dialled and came back, the entry is another
	// connect's, which counts and serves that launcher itself.
	ok := a.launchers[uid] == mine
	if ok {
		mine.conn = conn
	}
	a.mu.Unlock()
	if !ok {
		// The launcher's directory went away while we dialled.
		_ = conn.Close()
		return
	}
	// The socket connected to: a daemon the launcher restarts listens on a new one.
	connected, _ := os.Lstat(socket)
	opened := a.cfg.Clock.Now()
	a.cfg.Metrics.Launchers.Inc()
	a.cfg.Log.Info("connected to launcher", "vmiUID", uid)
	a.queue.Add(uid)
	// A target launcher's connection is what a waiting migration needs.
	a.migrations.enqueueAll()
	for range conn.Changes() {
		a.queue.Add(uid)
	}
	a.cfg.Log.Info("launcher connection ended", "vmiUID", uid)
	a.forget(uid)
	a.queue.Add(uid)
	if guard.hasStalled() {
		go a.reconnectLater(ctx, uid)
		return
	}
	if lasted := a.cfg.Clock.Since(opened); lasted < shortConnection {
		a.connectFailed(ctx, uid, "ended after "+lasted.Round(time.Millisecond).String())
	} else {
		a.mu.Lock()
		delete(a.dials, uid)
		a.mu.Unlock()
	}
	// A restarted daemon's socket that appeared while this connection was still held was
	// reported to a connect that found the launcher connected: connect to it now.
	if now, err := os.Lstat(socket); err == nil && connected != nil && !os.SameFile(connected, now) {
		a.cfg.Log.Info("the launcher's libvirt listens on a new socket; connecting again", "vmiUID", uid)
		go a.connect(ctx, uid)
	}
}

// connectFailed records that a connection to uid's launcher failed or ended early (how), and
// connects again after DialDelay of the run of such failures; a run of dialFailuresEvent gets
// an Event. A launcher whose directory goes is forgotten, and not connected to again.
func (a *Agent) connectFailed(ctx context.Context, uid, how string) {
	a.mu.Lock()
	g := a.dials[uid]
	if g == nil {
		g = &dialGate{}
		a.dials[uid] = g
	}
	g.failures++
	delay := DialDelay(g.failures)
	g.notBefore = a.cfg.Clock.Now().Add(delay)
	failures := g.failures
	a.connectAfter(ctx, uid, g, delay)
	a.mu.Unlock()
	a.cfg.Metrics.LauncherConnectFailures.Inc()
	a.cfg.Log.Warn("a connection to a launcher's libvirt failed or ended early; the next waits", "vmiUID", uid, "how", how, "failuresInARow", failures, "wait", delay)
	if failures == dialFailuresEvent {
		if vmi := a.cachedVMI(uid); vmi != nil {
			a.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonLauncherConnectionsFailing,
				"The launcher's libvirt on node %s failed or ended %d connections in a row; the agent connects again less and less often, up to every %s", a.cfg.NodeName, failures, maxReconnectAfterStall)
		}
	}
}

// connectAfter connects to uid's launcher after wait, unless a connect is set already; a.mu is held.
func (a *Agent) connectAfter(ctx context.Context, uid string, g *dialGate, wait time.Duration) {
	if g.scheduled {
		return
	}
	g.scheduled = true
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-a.cfg.Clock.After(wait):
		}
		a.mu.Lock()
		g.scheduled = false
		current := a.dials[uid] == g
		a.mu.Unlock()
		if !current {
			return // forgotten with its directory
		}
		if _, err := os.Lstat(filepath.Join(a.cfg.DomainsDir, uid, contract.LibvirtSocket)); err != nil {
			return // the socket's creation will say when to try again
		}
		a.connect(ctx, uid)
	}()
}

// ReasonLauncherConnectionsFailing is the Warning Event on a VMI whose launcher's libvirt fails
// connections, or ends them just after they open, several times in a row.
const ReasonLauncherConnectionsFailing = "LauncherConnectionsFailing"

// connectTimeout bounds connecting to a launcher's libvirt, every attempt included.
const connectTimeout = 30 * time.Second

// launcherStalled records that a call to a launcher's libvirt passed its deadline: its
// connection is cut (guardedConn), and the agent says so.
func (a *Agent) launcherStalled(uid, call string, deadline time.Duration) {
	a.cfg.Metrics.LibvirtCallsAbandoned.WithLabelValues(call).Inc()
	a.mu.Lock()
	a.stalls[uid]++
	after := stallBackoff(a.stalls[uid])
	a.mu.Unlock()
	a.cfg.Log.Warn("a launcher's libvirt did not answer in time; the call is abandoned and its connection cut",
		"vmiUID", uid, "call", call, "deadline", deadline, "reconnectAfter", after)
	if vmi := a.cachedVMI(uid); vmi != nil {
		a.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonLauncherStalled,
			"The launcher's libvirt on node %s did not answer %s within %s: the agent cut its connection and connects again in %s", a.cfg.NodeName, call, deadline, after)
	}
}

// stallBackoff is how long the agent waits before it connects again to a launcher that stalled n times.
func stallBackoff(n int) time.Duration {
	after := reconnectAfterStall
	for i := 1; i < n && after < maxReconnectAfterStall; i++ {
		after *= 2
	}
	return min(after, maxReconnectAfterStall)
}

// reconnectLater connects again to a launcher whose connection was cut for a stall, after its
// backoff, if its socket is still there.
func (a *Agent) reconnectLater(ctx context.Context, uid string) {
	a.mu.Lock()
	after := stallBackoff(a.stalls[uid])
	a.mu.Unlock()
	select {
	case <-ctx.Done():
		return
	case <-time.After(after):
	}
	if _, err := os.Lstat(filepath.Join(a.cfg.DomainsDir, uid, contract.LibvirtSocket)); err != nil {
		return
	}
	a.connect(ctx, uid)
}

// connected reports whether the agent holds a connection to the launcher of the VMI with uid.
func (a *Agent) connected(uid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.launchers[uid]
	return l != nil && l.conn != nil
}

// conn is the launcher connection of the VMI with uid; nil if none.
func (a *Agent) conn(uid string) DomainConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.launchers[uid]; l != nil {
		return l.conn
	}
	return nil
}

// switchOvers is when uid's launcher's guest pauses for a migration's switch-over; nil if its
// connection does not say.
func (a *Agent) switchOvers(uid string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.launchers[uid]; l != nil {
		if s, ok := l.conn.(switchOverer); ok {
			return s.SwitchOvers()
		}
	}
	return nil
}

// migrator is the launcher connection of the VMI with uid, for migrating; nil if none.
func (a *Agent) migrator(uid string) Migrator {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.launchers[uid]; l != nil {
		switch c := l.conn.(type) {
		case *guardedConn:
			return c.migrator()
		case Migrator:
			return c
		}
	}
	return nil
}

// migrating: vmi's latest migration has not ended. A dirty-rate sample would wait for it
// (libvirt holds the call while a migration runs), and its source samples the guest itself.
func migrating(vmi *v1alpha1.VirtualMachineInstance) bool {
	m := vmi.Status.MigrationState
	return m != nil && !m.Completed && !m.Failed
}

// warm samples the dirty rate of the guest of uid's launcher once (WarmDirtyRate), in the
// background: a launcher runs one QEMU, so once per launcher is once per QEMU.
func (a *Agent) warm(uid, name string) {
	a.mu.Lock()
	l := a.launchers[uid]
	if l == nil || l.warmed {
		a.mu.Unlock()
		return
	}
	l.warmed = true
	a.mu.Unlock()
	mg := a.migrator(uid)
	if mg == nil {
		return
	}
	go func() {
		if err := WarmDirtyRate(mg, name); err != nil {
			a.cfg.Log.Info("sampling the guest's dirty rate once to warm QEMU's page sampling failed; a migration's first estimate may read low", "domain", name, "err", err)
		}
	}()
}

// cachedVMI is this node's VMI with uid from the informer's cache (not a copy: read only); nil if
// it has none.
func (a *Agent) cachedVMI(uid string) *v1alpha1.VirtualMachineInstance {
	objs, err := a.informer.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil || len(objs) == 0 {
		return nil
	}
	return objs[0].(*v1alpha1.VirtualMachineInstance)
}

// signal is a SIGTERM a launcher reported: when, and when its pod's grace period ends.
type signal struct{ at, deadline time.Time }

func (a *Agent) forget(uid string) {
	a.mu.Lock()
	l, ok := a.launchers[uid]
	delete(a.launchers, uid)
	a.mu.Unlock()
	a.linksMu.Lock()
	delete(a.unlinked, uid)
	a.linksMu.Unlock()
	if ok && l.conn != nil {
		_ = l.conn.Close()
		a.cfg.Metrics.Launchers.Dec()
	}
}

func (a *Agent) closeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, l := range a.launchers {
		if l.conn != nil {
			_ = l.conn.Close()
		}
		delete(a.launchers, uid)
	}
}

func (a *Agent) runWorker(ctx context.Context) {
	for processNext(ctx, a.queue, a.sync, a.cfg.Log) {
	}
}

// notYetError is a sync's wait for something expected to come (a target launcher still
// starting): retried as an error is, but told as a wait, not as a failure an operator must read.
type notYetError struct{ what string }

func (e *notYetError) Error() string { return e.what }

// notYet is the wait for what, as a sync's error.
func notYet(format string, args ...any) error {
	return &notYetError{what: fmt.Sprintf(format, args...)}
}

// processNext handles one key of a queue; it alone decides about retries: an error retries
// with the queue's rate limit (a notYet wait too, logged as one), a positive requeueAfter looks
// again then.
func processNext(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string],
	sync func(context.Context, string) (time.Duration, error), log *slog.Logger) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)
	requeue, err := sync(ctx, key)
	var waiting *notYetError
	switch {
	case errors.As(err, &waiting):
		log.Info("waiting, will look again", "key", key, "for", waiting.Error())
		queue.AddRateLimited(key)
	case err != nil:
		log.Error("sync failed, will retry", "key", key, "err", err)
		queue.AddRateLimited(key)
	case requeue > 0:
		queue.Forget(key)
		queue.AddAfter(key, requeue)
	default:
		queue.Forget(key)
	}
	return true
}

// sync observes one VMI and its domain, decides, and carries the decision out.
func (a *Agent) sync(ctx context.Context, uid string) (time.Duration, error) {
	objs, err := a.informer.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil {
		return 0, err
	}
	if len(objs) == 0 {
		// Not on this node (yet: its informer event brings it back), or no longer: deleted,
		// replaced or moved while its launcher here still runs a guest.
		_, err := a.syncStray(ctx, uid)
		return 0, err
	}
	vmi := objs[0].(*v1alpha1.VirtualMachineInstance).DeepCopy()

	a.mu.Lock()
	l := a.launchers[uid]
	var conn DomainConn
	var shutdownSent bool
	if l != nil {
		conn, shutdownSent = l.conn, l.shutdownSent
	}
	a.mu.Unlock()
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	var dom *Domain
	if conn != nil {
		if dom, err = conn.Observe(ctx, name); err != nil {
			return 0, fmt.Errorf("observing domain %s: %w", name, err)
		}
		if dom != nil {
			if s, ok := a.signalled.Load(uid); ok && dom.GracefulShutdown == nil {
				dom.GracefulShutdown, dom.PodDeadline = &s.(*signal).at, &s.(*signal).deadline
			}
			dom.ShutdownSent = shutdownSent
			dom.NotMigratableReason, dom.NotMigratableMessage = NotMigratable(vmi)
			dom.Deletion = a.podDeletion(vmi)
		}
	}
	if dom != nil && dom.State == DomainRunning && !migrating(vmi) {
		a.warm(uid, name)
	}
	plan := Decide(vmi, dom, a.eviction(), a.cfg.NodeName, a.cfg.Now())

	if plan.Shutdown {
		if err := conn.Shutdown(ctx, name); err != nil {
			return 0, fmt.Errorf("pressing the power button: %w", err)
		}
		a.mu.Lock()
		l.shutdownSent = true
		a.mu.Unlock()
	}
	if plan.Destroy {
		if err := conn.Destroy(ctx, name); err != nil {
			return 0, fmt.Errorf("destroying the guest: %w", err)
		}
	}
	if plan.Resume {
		mg := a.migrator(uid)
		if mg == nil {
			return 0, fmt.Errorf("the guest arrived paused and its launcher's libvirt is not connected")
		}
		if err := mg.Resume(name); err != nil {
			return 0, fmt.Errorf("running the guest that arrived paused: %w", err)
		}
		a.cfg.Metrics.ResumedOnArrival.Inc()
	}
	if plan.Status != nil && !apiequality.Semantic.DeepEqual(*plan.Status, vmi.Status) {
		vmi.Status = *plan.Status
		_, err := a.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).UpdateStatus(ctx, vmi, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return 0, fmt.Errorf("status changed under us: %w", err)
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("writing status: %w", err)
		}
		if plan.Marked {
			latency := a.cfg.Now().Sub(*dom.GracefulShutdown)
			a.cfg.Metrics.MarkLatency.Observe(latency.Seconds())
			a.cfg.Log.Info("marked for evacuation", "vmi", vmi.Namespace+"/"+vmi.Name, "deadline", vmi.Status.EvacuationDeadline, "markLatency", latency)
		}
	}
	if plan.SignalDecision != "" {
		a.cfg.Metrics.SignalDecisions.WithLabelValues(plan.SignalDecision).Inc()
	}
	if plan.Lost {
		a.cfg.Metrics.EvacuationsLost.Inc()
	}
	if plan.StrayReason != "" {
		a.cfg.Metrics.StrayGuestsDestroyed.WithLabelValues(plan.StrayReason).Inc()
	}
	for _, e := range plan.Events {
		a.cfg.Recorder.Event(vmi, e.Type, e.Reason, e.Message)
		if e.Type == corev1.EventTypeWarning {
			a.cfg.Log.Warn(e.Message, "vmi", vmi.Namespace+"/"+vmi.Name, "reason", e.Reason)
		} else {
			a.cfg.Log.Info(e.Message, "vmi", vmi.Namespace+"/"+vmi.Name, "reason", e.Reason)
		}
	}
	return plan.RequeueAfter, nil
}
