package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/migrationproxy"
	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// Migrator is what the agent's migration roles need of a launcher's libvirt, beyond DomainConn.
type Migrator interface {
	Migrate(ctx context.Context, name string, opts domain.MigrateOptions) error
	JobStats(name string) (domain.JobStats, error)
	// StartDirtyRateCalc and DirtyRate estimate the guest's dirty rate (domain.Conn's).
	StartDirtyRateCalc(name string, period time.Duration, mode domain.DirtyRateMode) error
	DirtyRate(name string) (uint64, bool, error)
	StartPostCopy(name string) error
	// State is the domain's state and its reason (domain.Conn.State).
	State(name string) (domain.State, domain.Reason, error)
	Suspend(name string) error
	Resume(name string) error
	// LoadQEMUCapabilities returns once the launcher's libvirtd has QEMU's capabilities.
	LoadQEMUCapabilities() error
	// Session reports whether the launcher's libvirtd is a session daemon (domain.Conn.Session).
	Session() bool
}

// migrations runs this node's part of live migrations: as target, the proxies to the target
// launcher; as source, the proxies from the source launcher and the migration itself.
type migrations struct {
	a        *Agent
	lifeboat lifeboatclient.Interface
	// listers are the caches of the migrations from and to this node.
	listers   []lifeboatlisters.VirtualMachineInstanceMigrationLister
	informers []cache.SharedIndexInformer
	synced    []cache.InformerSynced
	queue     workqueue.TypedRateLimitingInterface[string]
	address   string // this node's address, where target proxies listen

	mu     sync.Mutex
	active map[string]*activeMigration // by migration UID
	// vmiUIDs are the VMIs found for migrations (by migration UID), so that a target that waits
	// for its launcher does not read the VMI on every retry.
	vmiUIDs map[string]knownVMI
	// ended are the migrations from this node whose memory transfer ended (by UID): a migration
	// made ahead that follows one of them has its slot (status.evacuation.slotAfterUID).
	ended map[string]endedTransfer
}

// endedTransfer is when a migration's transfer ended here, and the UID of the migration that
// took its slot ("" while none has): a slot is taken once, whatever the statuses say.
type endedTransfer struct {
	at    time.Time
	taken string
}

// knownVMI is the UID of a migration's VMI, beside the migration's namespace/name.
type knownVMI struct{ key, uid string }

type activeMigration struct {
	keyName string // namespace/name of the migration
	cancel  context.CancelFunc
	proxies []*migrationproxy.Proxy
}

func (am *activeMigration) key() string { return am.keyName }

func (a *Agent) newMigrations(lb lifeboatclient.Interface, informers []lifeboatinformers.VirtualMachineInstanceMigrationInformer, address string) *migrations {
	m := &migrations{
		a: a, lifeboat: lb, address: address,
		queue:  workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "agent-migrations"}),
		active: map[string]*activeMigration{}, vmiUIDs: map[string]knownVMI{}, ended: map[string]endedTransfer{},
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			m.queue.Add(key)
		}
	}
	for _, informer := range informers {
		m.listers = append(m.listers, informer.Lister())
		m.informers = append(m.informers, informer.Informer())
		m.synced = append(m.synced, informer.Informer().HasSynced)
		_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
		})
	}
	return m
}

func (m *migrations) enqueueAll() {
	for _, lister := range m.listers {
		list, err := lister.List(labels.Everything())
		if err != nil {
			continue
		}
		for _, mig := range list {
			m.queue.Add(mig.Namespace + "/" + mig.Name)
		}
	}
}

// get finds a migration in the caches; NotFound when it neither leaves nor reaches this node.
func (m *migrations) get(ns, name string) (*v1alpha1.VirtualMachineInstanceMigration, error) {
	for _, lister := range m.listers {
		mig, err := lister.VirtualMachineInstanceMigrations(ns).Get(name)
		if !apierrors.IsNotFound(err) {
			return mig, err
		}
	}
	return nil, apierrors.NewNotFound(v1alpha1.Resource("virtualmachineinstancemigrations"), name)
}

func (m *migrations) run(ctx context.Context) {
	defer m.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), m.synced...) {
		return
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for processNext(ctx, m.queue, func(ctx context.Context, key string) (time.Duration, error) {
			return m.sync(ctx, key)
		}, m.a.cfg.Log.With("queue", "migrations")) {
		}
	}, time.Second)
	<-ctx.Done()
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, am := range m.active {
		am.stop()
		delete(m.active, uid)
	}
}

func (am *activeMigration) stop() {
	am.cancel()
	for _, p := range am.proxies {
		_ = p.Close()
	}
}

// finish ends this node's part of a migration.
func (m *migrations) finish(uid string) {
	m.mu.Lock()
	am := m.active[uid]
	delete(m.active, uid)
	delete(m.vmiUIDs, uid)
	m.mu.Unlock()
	if am != nil {
		am.stop()
	}
}

func (m *migrations) sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	cached, err := m.get(ns, name)
	if apierrors.IsNotFound(err) {
		m.finishByKey(key)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	mig := cached.DeepCopy()
	uid := string(mig.UID)
	node := m.a.cfg.NodeName
	switch {
	case mig.DeletionTimestamp != nil || mig.Status.Phase.Terminal():
		// Cancelled or over: stop whatever runs here (a running pre-copy is aborted).
		m.finish(uid)
		return 0, nil
	case mig.Status.TargetNode == node && mig.Status.Phase == v1alpha1.MigrationPreparingTarget:
		return 0, m.prepareTarget(ctx, mig)
	case mig.Status.SourceNode == node && mig.Status.Phase == v1alpha1.MigrationTargetReady && mig.WaitingForSlot() && !m.takeSlot(mig):
		// Made ahead of a free parallel-migration slot: its target is ready, and the evacuation
		// controller's release of the slot (an update of the migration), or the end here of the
		// migration it follows, brings it back here.
		return 0, nil
	case mig.Status.SourceNode == node && mig.Status.Phase == v1alpha1.MigrationTargetReady:
		if mig.WaitingForSlot() {
			m.a.cfg.Log.Info("starting a migration in the slot of the one it follows, whose transfer ended here", "migration", key, "follows", mig.SlotAfter())
		}
		return 0, m.startSource(ctx, mig)
	case mig.Status.SourceNode == node && mig.Status.Phase == v1alpha1.MigrationRunning:
		return m.recoverSource(ctx, mig)
	}
	return 0, nil
}

// endedMemory is how long this agent remembers that a migration's transfer ended: its follower
// is started at once, and the controller's release comes well within this if it comes late.
const endedMemory = 10 * time.Minute

// transferDone records that the memory transfer of the migration with uid ended on this node,
// and brings back the migration that follows it, which now has its slot.
func (m *migrations) transferDone(uid string) {
	now := m.a.cfg.Clock.Now()
	m.mu.Lock()
	for u, e := range m.ended {
		if now.Sub(e.at) > endedMemory {
			delete(m.ended, u)
		}
	}
	m.ended[uid] = endedTransfer{at: now}
	m.mu.Unlock()
	for _, lister := range m.listers {
		list, err := lister.List(labels.Everything())
		if err != nil {
			continue
		}
		for _, mig := range list {
			if mig.SlotAfter() == uid {
				m.queue.Add(mig.Namespace + "/" + mig.Name)
			}
		}
	}
}

// takeSlot reports whether mig, made ahead, may start in the slot of the migration it follows:
// that one's transfer ended on this node, and no other migration took its slot here.
func (m *migrations) takeSlot(mig *v1alpha1.VirtualMachineInstanceMigration) bool {
	after := mig.SlotAfter()
	if after == "" {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.ended[after]
	if !ok || e.taken != "" && e.taken != string(mig.UID) {
		return false
	}
	e.taken = string(mig.UID)
	m.ended[after] = e
	return true
}

func (m *migrations) finishByKey(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, am := range m.active {
		if am.key() == key {
			am.stop()
			delete(m.active, uid)
		}
	}
	for uid, known := range m.vmiUIDs {
		if known.key == key {
			delete(m.vmiUIDs, uid)
		}
	}
}

// vmiUID finds the UID of a migration's VMI, which names the launcher directories on both nodes:
// from the informer where it holds the VMI (on the source node, whose VMI it is), else read.
func (m *migrations) vmiUID(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) (string, *v1alpha1.VirtualMachineInstance, error) {
	if vmi := m.cachedVMI(mig.Namespace, mig.Spec.VMIName); vmi != nil {
		return string(vmi.UID), vmi, nil
	}
	vmi, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(mig.Namespace).Get(ctx, mig.Spec.VMIName, metav1.GetOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("reading VMI %s: %w", mig.Spec.VMIName, err)
	}
	return string(vmi.UID), vmi, nil
}

// prepareTarget opens this node's proxies to the target launcher and says where they are.
func (m *migrations) prepareTarget(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) error {
	m.mu.Lock()
	known, ok := m.vmiUIDs[string(mig.UID)]
	m.mu.Unlock()
	uid := known.uid
	if !ok {
		var err error
		if uid, _, err = m.vmiUID(ctx, mig); err != nil {
			return err
		}
		m.mu.Lock()
		m.vmiUIDs[string(mig.UID)] = knownVMI{key: mig.Namespace + "/" + mig.Name, uid: uid}
		m.mu.Unlock()
	}
	if !m.a.connected(uid) {
		return notYet("the target launcher of %s to connect", mig.Spec.VMIName)
	}
	// The proxies forward into the directory's pod: it must be the target the controller
	// recorded. Linked and connected, it stays linked until its launcher disconnects.
	if m.a.cfg.PodInformer != nil {
		if p, ok := m.a.linkedPod(uid); !ok || p.Namespace != mig.Namespace || p.Name != mig.Status.TargetPod || p.UID != mig.Status.TargetPodUID {
			return notYet("the directory of %s to link the migration's recorded target pod %s (UID %s)", mig.Spec.VMIName, mig.Status.TargetPod, mig.Status.TargetPodUID)
		}
	}
	// The target launcher loads QEMU's capabilities as it starts, a probe of seconds for a
	// node's first launcher; the guest must not be sent before, or the migration waits on the
	// probe against its deadline. Once loaded this answers at once.
	if mg := m.a.migrator(uid); mg != nil {
		if err := mg.LoadQEMUCapabilities(); err != nil {
			return fmt.Errorf("waiting for the target launcher of %s to load QEMU's capabilities: %w", mig.Spec.VMIName, err)
		}
	}
	m.mu.Lock()
	_, running := m.active[string(mig.UID)]
	m.mu.Unlock()
	if running {
		return nil
	}
	// Only the source node the migration names, and only for this migration, gets through.
	tlsConfig, err := migrationtls.ServerConfig(m.a.cfg.Certificates, string(mig.UID), mig.Status.SourceNode)
	if err != nil {
		return fmt.Errorf("the target proxies of %s: %w", mig.Name, err)
	}
	refused := func(err error) {
		m.a.cfg.Metrics.MigrationConnectionsRefused.Inc()
		m.a.cfg.Log.Warn("refused a connection to a migration's target proxy", "migration", mig.Namespace+"/"+mig.Name, "source", mig.Status.SourceNode, "err", err)
	}
	dir := filepath.Join(m.a.cfg.DomainsDir, uid)
	pctx, cancel := context.WithCancel(context.Background())
	listen := func(socket string) (*migrationproxy.Proxy, error) {
		return migrationproxy.ListenTLS(pctx, net.JoinHostPort(m.address, "0"), socket, tlsConfig, refused)
	}
	am := &activeMigration{cancel: cancel, keyName: mig.Namespace + "/" + mig.Name}
	libvirt, err := listen(filepath.Join(dir, contract.LibvirtSocket))
	if err != nil {
		cancel()
		return fmt.Errorf("listening for the migration's libvirt connection: %w", err)
	}
	memory, err := listen(filepath.Join(dir, domain.MigrationQEMUSocket))
	if err != nil {
		cancel()
		_ = libvirt.Close()
		return fmt.Errorf("listening for the migration's memory stream: %w", err)
	}
	disks, err := listen(filepath.Join(dir, domain.MigrationNBDSocket))
	if err != nil {
		cancel()
		_, _ = libvirt.Close(), memory.Close()
		return fmt.Errorf("listening for the migration's disk copy: %w", err)
	}
	am.proxies = []*migrationproxy.Proxy{libvirt, memory, disks}
	m.mu.Lock()
	m.active[string(mig.UID)] = am
	m.mu.Unlock()

	mig.Status.TargetProxy = &v1alpha1.MigrationProxy{Libvirt: libvirt.Addr().String(), Memory: memory.Addr().String(), Disks: disks.Addr().String(),
		PostCopy: m.a.podHasDevice(mig.Namespace, mig.Status.TargetPod, v1alpha1.DeviceUserFaultFD)}
	setMigrationPhase(mig, v1alpha1.MigrationTargetReady)
	if _, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(mig.Namespace).UpdateStatus(ctx, mig, metav1.UpdateOptions{}); err != nil {
		m.finish(string(mig.UID))
		return fmt.Errorf("announcing the target proxies: %w", err)
	}
	m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeNormal, "TargetReady", "node %s listens for the guest at %s (libvirt) and %s (memory)", m.a.cfg.NodeName, libvirt.Addr(), memory.Addr())
	return nil
}

// targetDomainReady records on the VMI that its guest runs in this node's target launcher (the
// launcher reports its domain started once the guest arrived): the source launcher exits as its
// guest leaves, and with it may go the reply to the source's migration call and its own last
// report, so the source agent learns the outcome from here. A launcher repeats its reports on
// every reconnection; a recorded time stays.
func (m *migrations) targetDomainReady(ref notify.VMIRef) {
	var mig *v1alpha1.VirtualMachineInstanceMigration
	m.mu.Lock()
	for _, known := range m.vmiUIDs {
		if known.uid == ref.UID {
			ns, name, _ := cache.SplitMetaNamespaceKey(known.key)
			mig = m.cachedMigration(ns, name)
		}
	}
	m.mu.Unlock()
	if mig == nil || mig.Status.TargetNode != m.a.cfg.NodeName || mig.Status.Phase.Terminal() {
		return
	}
	now := metav1.Now()
	recorded := false
	err := m.updateVMI(context.Background(), ref.Namespace, ref.Name, func(v *v1alpha1.VirtualMachineInstance) {
		s := v.Status.MigrationState
		// The notify server hands on only reports naming its socket's VMI; the UID is checked
		// here too, as recordDowntime does, so that no other VMI is ever written for one.
		if string(v.UID) == ref.UID && s != nil && s.MigrationUID == string(mig.UID) && s.TargetNode == m.a.cfg.NodeName && s.TargetNodeDomainReadyTimestamp == nil {
			s.TargetNodeDomainReadyTimestamp, recorded = &now, true
		}
	})
	if err != nil {
		m.a.cfg.Log.Error("recording that the guest runs in the target launcher", "migration", mig.Namespace+"/"+mig.Name, "err", err)
		return
	}
	if recorded {
		m.a.cfg.Log.Info("the guest runs in the target launcher", "migration", mig.Namespace+"/"+mig.Name, "vmi", ref.Name)
	}
}

// clockSkew is how far the source node's clock (the migration state's start) and this node's
// (the launcher's report) may differ for recordDowntime; an earlier arrival's report is older
// by far more, a migration away and one back.
const clockSkew = 5 * time.Second

// recordDowntime writes on the VMI how long the migration that brought its guest to this node
// stopped it, as the target launcher reported at (libvirt's figure, a moment after the guest
// runs here), so that those who follow the migration read it from the API. Only a migration to
// this node that started before the report and has no figure yet gets it: a launcher repeats its
// reports on every reconnection, and a later migration's state is not this one's.
func (m *migrations) recordDowntime(ref notify.VMIRef, at time.Time, downtime time.Duration) {
	wants := func(v *v1alpha1.VirtualMachineInstance) bool {
		s := v.Status.MigrationState
		return string(v.UID) == ref.UID && s != nil && s.TargetNode == m.a.cfg.NodeName && !s.Failed && s.DowntimeMilliseconds == nil &&
			s.StartTimestamp != nil && !at.Before(s.StartTimestamp.Add(-clockSkew))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Fresh: a replayed report must not write a VMI that has moved on.
	v, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil || !wants(v) {
		return
	}
	recorded := false
	err = m.updateVMI(ctx, ref.Namespace, ref.Name, func(v *v1alpha1.VirtualMachineInstance) {
		if recorded = wants(v); recorded {
			v.Status.MigrationState.DowntimeMilliseconds = ptr.To(downtime.Milliseconds())
		}
	})
	if err != nil {
		m.a.cfg.Log.Error("recording the guest's downtime on its VMI", "vmi", ref.Namespace+"/"+ref.Name, "err", err)
		return
	}
	if recorded {
		m.a.cfg.Log.Info("recorded the guest's downtime on its VMI", "vmi", ref.Namespace+"/"+ref.Name, "downtime", downtime)
	}
}

func setMigrationPhase(mig *v1alpha1.VirtualMachineInstanceMigration, p v1alpha1.VirtualMachineInstanceMigrationPhase) {
	if mig.Status.Phase == p {
		return
	}
	mig.Status.Phase = p
	mig.Status.PhaseTransitionTimestamps = append(mig.Status.PhaseTransitionTimestamps, v1alpha1.MigrationPhaseTransition{Phase: p, Timestamp: metav1.Now()})
}

// updateMigration writes a change to a migration's status. The first try starts from the
// informers' copy, which is current nearly always; a conflict retries with a fresh read. Reading
// fresh every time cost an evacuation about five GETs (docs/benchmarks.md).
func (m *migrations) updateMigration(ctx context.Context, ns, name string, change func(*v1alpha1.VirtualMachineInstanceMigration)) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var mig *v1alpha1.VirtualMachineInstanceMigration
		if first {
			first, mig = false, m.cachedMigration(ns, name)
		}
		if mig == nil {
			var err error
			if mig, err = m.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		change(mig)
		_, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, mig, metav1.UpdateOptions{})
		return err
	})
}

// cachedMigration is a copy of the migration from the informers, or nil.
func (m *migrations) cachedMigration(ns, name string) *v1alpha1.VirtualMachineInstanceMigration {
	for _, l := range m.listers {
		if mig, err := l.VirtualMachineInstanceMigrations(ns).Get(name); err == nil {
			return mig.DeepCopy()
		}
	}
	return nil
}

// updateVMI writes a change to a VMI's status as updateMigration does, first from the informer's
// copy (which holds this node's VMIs).
func (m *migrations) updateVMI(ctx context.Context, ns, name string, change func(*v1alpha1.VirtualMachineInstance)) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vmi *v1alpha1.VirtualMachineInstance
		if first {
			first, vmi = false, m.cachedVMI(ns, name)
		}
		if vmi == nil {
			var err error
			if vmi, err = m.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		change(vmi)
		_, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{})
		return err
	})
}

// cachedVMI is a copy of the VMI from the agent's informer, or nil.
func (m *migrations) cachedVMI(ns, name string) *v1alpha1.VirtualMachineInstance {
	if obj, ok, err := m.a.informer.GetIndexer().GetByKey(ns + "/" + name); err == nil && ok {
		return obj.(*v1alpha1.VirtualMachineInstance).DeepCopy()
	}
	return nil
}

var errNoProxy = errors.New("the migration has no target proxy")

// clearMark is what a successful migration does to its VMI: the guest runs on the target now.
func clearMark(vmi *v1alpha1.VirtualMachineInstance, mig *v1alpha1.VirtualMachineInstanceMigration, now metav1.Time) {
	vmi.Status.NodeName = mig.Status.TargetNode
	// The guest's launcher is the target pod the controller recorded; without a recorded UID
	// (a migration begun before it was recorded) the VMI controller records the pod it finds.
	vmi.Status.LauncherPod = nil
	if mig.Status.TargetPodUID != "" {
		vmi.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: mig.Status.TargetPod, UID: mig.Status.TargetPodUID}
	}
	v1alpha1.ClearEvacuationMark(&vmi.Status, "Evacuated",
		fmt.Sprintf("the VM moved from node %s to node %s by migration %s", mig.Status.SourceNode, mig.Status.TargetNode, mig.Name), now)
}
