package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/agent/migrationproxy"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// progressInterval is how often the source agent reads a running migration's statistics;
// progressWriteInterval how often it publishes them on the migration's status.
const (
	progressInterval      = 500 * time.Millisecond
	progressWriteInterval = 2 * time.Second
)

// startSource opens the proxies from the source launcher's directory to the target's and
// starts the migration; runSource carries it to its end.
func (m *migrations) startSource(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) error {
	if mig.Status.TargetProxy == nil {
		return errNoProxy
	}
	m.mu.Lock()
	_, running := m.active[string(mig.UID)]
	m.mu.Unlock()
	if running {
		return nil
	}
	uid, vmi, err := m.vmiUID(ctx, mig)
	if err != nil {
		return err
	}
	mg := m.a.migrator(uid)
	if mg == nil {
		return fmt.Errorf("the source launcher of %s is not connected", vmi.Name)
	}
	pctx, err := m.openSourceProxies(mig, vmi, uid)
	if err != nil {
		return err
	}

	now := metav1.Now()
	// This agent's copy of the migration and of its VMI can be old (a node frozen and thawed
	// acts on what it knew): the start is written only over a migration still TargetReady, and
	// only on the VMI it moves, still on this node. Otherwise the migration failed or its VM
	// was started again elsewhere meanwhile, and a start written over it would hold that VM's
	// next migrations back as if this one ran.
	var stale string
	err = m.updateMigration(ctx, mig.Namespace, mig.Name, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		if stale = staleStart(x); stale != "" {
			return
		}
		setMigrationPhase(x, v1alpha1.MigrationRunning)
		x.Status.StartTimestamp, x.Status.Mode = &now, v1alpha1.MigrationModePreCopy
	})
	if err == nil && stale != "" {
		// The migration failed or went meanwhile: its new state brings it back here as it is.
		m.finish(string(mig.UID))
		m.a.cfg.Log.Info("not starting a migration that changed meanwhile", "migration", mig.Namespace+"/"+mig.Name, "why", stale)
		return nil
	}
	if err == nil {
		err = m.updateVMI(ctx, vmi.Namespace, vmi.Name, func(v *v1alpha1.VirtualMachineInstance) {
			stale = ""
			if string(v.UID) != uid || v.Status.NodeName != mig.Status.SourceNode || v.Status.Phase.Terminal() {
				stale = fmt.Sprintf("VMI %s (UID %s) is no longer running on node %s", vmi.Name, uid, mig.Status.SourceNode)
				return
			}
			v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{
				MigrationName: mig.Name, MigrationUID: string(mig.UID), SourceNode: mig.Status.SourceNode, TargetNode: mig.Status.TargetNode,
				StartTimestamp: &now, Mode: v1alpha1.MigrationModePreCopy, Cause: mig.Status.Cause,
			}
		})
	}
	if err != nil {
		m.finish(string(mig.UID))
		return fmt.Errorf("recording the start of migration %s: %w", mig.Name, err)
	}
	if stale != "" {
		// Recorded Running above, for a VM no longer here: it fails at once, with the reason.
		m.finish(string(mig.UID))
		m.a.cfg.Log.Info("not starting a migration whose VM is no longer on this node", "migration", mig.Namespace+"/"+mig.Name, "why", stale)
		return m.failStale(ctx, mig, stale)
	}
	m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeNormal, "MigrationStarted", "moving %s from node %s to node %s", vmi.Name, mig.Status.SourceNode, mig.Status.TargetNode)
	// The migration's loop runs on its own goroutine: its calls take no worker's turn.
	go m.runSource(pctx, mig.DeepCopy(), vmi, loopMigrator(mg))
	return nil
}

// staleStart says why migration x, as the API server has it, must not be started by its source:
// "" when it may (TargetReady, not being deleted).
func staleStart(x *v1alpha1.VirtualMachineInstanceMigration) string {
	switch {
	case x.DeletionTimestamp != nil:
		return "the migration is being deleted"
	case x.Status.Phase != v1alpha1.MigrationTargetReady:
		return fmt.Sprintf("the migration is %s, no longer %s", x.Status.Phase, v1alpha1.MigrationTargetReady)
	}
	return ""
}

// failStale records as Failed a migration this agent just recorded Running, whose VMI turned out
// to be gone from this node.
func (m *migrations) failStale(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration, why string) error {
	now := metav1.Now()
	err := m.updateMigration(ctx, mig.Namespace, mig.Name, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		if x.Status.Phase == v1alpha1.MigrationRunning && x.Status.EndTimestamp == nil {
			setMigrationPhase(x, v1alpha1.MigrationFailed)
			x.Status.EndTimestamp, x.Status.FailureReason = &now, why
		}
	})
	if err != nil {
		return fmt.Errorf("recording migration %s failed: %w", mig.Name, err)
	}
	return nil
}

// openSourceProxies opens this node's proxies for mig, from the source launcher's directory to
// the target agent's, and registers mig as one this agent drives; the returned context ends when
// it no longer does.
func (m *migrations) openSourceProxies(mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, uid string) (context.Context, error) {
	// Only the target node the migration names is sent the guest.
	tlsConfig, err := migrationtls.ClientConfig(m.a.cfg.Certificates, string(mig.UID), mig.Status.TargetNode)
	if err != nil {
		return nil, fmt.Errorf("the source proxies of %s: %w", mig.Name, err)
	}
	dir := filepath.Join(m.a.cfg.DomainsDir, uid)
	pctx, cancel := context.WithCancel(context.Background())
	am := &activeMigration{cancel: cancel, keyName: mig.Namespace + "/" + mig.Name}
	streams := []struct{ socket, target string }{
		{domain.MigrationLibvirtSocket, mig.Status.TargetProxy.Libvirt},
		{domain.MigrationQEMUSocket, mig.Status.TargetProxy.Memory},
	}
	if CopiesDisks(vmi) {
		if mig.Status.TargetProxy.Disks == "" {
			am.stop()
			return nil, fmt.Errorf("VMI %s has disks to copy and the target agent serves no disk proxy", vmi.Name)
		}
		streams = append(streams, struct{ socket, target string }{domain.MigrationNBDSocket, mig.Status.TargetProxy.Disks})
	}
	for _, p := range streams {
		proxy, err := migrationproxy.ListenUnix(pctx, filepath.Join(dir, p.socket), migrationproxy.DialTLS(p.target, tlsConfig))
		if err != nil {
			am.stop()
			return nil, fmt.Errorf("listening on %s for the migration: %w", p.socket, err)
		}
		am.proxies = append(am.proxies, proxy)
	}
	m.mu.Lock()
	m.active[string(mig.UID)] = am
	m.mu.Unlock()
	return pctx, nil
}

// sourceOptions are the MigrateOptions of vmi's migration through this node's proxies.
func sourceOptions(vmi *v1alpha1.VirtualMachineInstance, mg Migrator, allowed Allowed, bandwidth uint64) domain.MigrateOptions {
	// The launcher's libvirt sees its directory at the path in the pod, not at the agent's.
	podDir := contract.PodRunDir
	destURI, migrateURI := domain.ProxiedURIs(podDir, mg.Session())
	opts := domain.MigrateOptions{DestURI: destURI, MigrateURI: migrateURI}
	if CopiesDisks(vmi) {
		opts.DisksURI = domain.ProxiedDisksURI(podDir)
	}
	// NotMigratable let only ReadWriteMany claims through as disks that stay in place.
	opts.SharedDisks = HasClaims(vmi)
	return WithConvergence(opts, allowed, bandwidth)
}

// runSource migrates, escalating convergence as the deadline nears, and records the outcome.
func (m *migrations) runSource(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, mg Migrator) {
	defer m.finish(string(mig.UID))
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	allowed, bandwidth := MigrationSettings(m.a.eviction().Config, vmi)
	log := m.a.cfg.Log.With("migration", mig.Namespace+"/"+mig.Name, "vmi", vmi.Name)
	if allowed.PostCopy && mg.Session() && (mig.Status.TargetProxy == nil || !mig.Status.TargetProxy.PostCopy) {
		// The target's QEMU takes the guest's page faults through a userfaultfd that handles the
		// kernel's faults too, which an unprivileged launcher has only from /dev/userfaultfd: the
		// migration plans without post-copy rather than fail at the switch.
		allowed.PostCopy = false
		log.Info("post-copy is allowed but the target launcher has no userfaultfd; the migration plans without it")
		m.a.cfg.Recorder.Event(mig, corev1.EventTypeNormal, "PostCopyUnavailable",
			"post-copy is allowed, but the target launcher has no "+v1alpha1.DeviceUserFaultFD+" (not every node offers it): converging without post-copy")
	}
	opts := sourceOptions(vmi, mg, allowed, bandwidth)
	clk := m.a.cfg.Clock
	start := clk.Now()
	var published time.Time
	c := ConvergingMigration{
		Migrator: mg, Domain: name, Options: opts, Allowed: allowed, Clock: clk, Log: log,
		Cancelled: func() bool {
			if m.markCleared(mig, string(vmi.UID)) {
				log.Info("the evacuation mark was cleared: cancelling the migration")
				return true
			}
			return false
		},
		Escalated: func(next v1alpha1.MigrationMode, p Progress) {
			m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeNormal, "MigrationEscalated", "switched to %s to finish before the deadline: %s", next, p)
			_ = m.updateMigration(context.Background(), mig.Namespace, mig.Name, func(x *v1alpha1.VirtualMachineInstanceMigration) { x.Status.Mode = next })
		},
		Progressed: func(stats domain.JobStats) {
			if clk.Since(published) >= progressWriteInterval {
				published = clk.Now()
				m.publishProgress(mig, &stats)
			}
		},
		Sampled: func(r SampleResult, rate uint64) {
			m.a.cfg.Metrics.DirtyRateEstimates.WithLabelValues(string(r)).Inc()
			if r == SampleMeasured {
				m.a.cfg.Metrics.DirtyRateEstimated.Observe(float64(rate))
			}
		},
		ResidentBounds: m.a.residentBounds(log),
		GuestRAM:       m.a.guestRAM(notify.VMIRef{Namespace: vmi.Namespace, Name: vmi.Name, UID: string(vmi.UID)}, log),
	}
	if mig.Status.Deadline != nil {
		c.Deadline = mig.Status.Deadline.Time
	}
	c.Tightened = m.tightened(mig, string(vmi.UID), c.Deadline)
	fw := &forwarder{m: m, h: m.prepareHandover(ctx, mig, vmi), vmi: vmi, log: log}
	m.a.handovers.Store(string(vmi.UID), struct{}{})
	stopWatch := make(chan struct{})
	watched := fw.watchSwitchOver(stopWatch)
	mode, result := MigrateConverging(ctx, c)
	close(stopWatch)
	<-watched
	if result != nil {
		fw.undo()
	}
	// The moment libvirt's migration ended, apart from the status writes that follow: the
	// drain benchmark reads the controllers' overhead from it.
	log.Info("libvirt migration ended", "mode", mode, "err", result)
	// Whatever the outcome, no more memory leaves for it: a migration following it has its slot.
	m.transferDone(string(mig.UID))
	where := ""
	if result != nil {
		outcome, seen := m.afterFailedCall(mig, vmi, mg, name, start, mode)
		switch outcome {
		case OutcomeSucceeded:
			// The reply to the migration call can be lost as the source daemon exits.
			log.Warn("the migration call failed, but the guest left this node by migration and runs on the target", "err", result)
			result = nil
		case OutcomeFailed:
			where = "the guest keeps running on node " + mig.Status.SourceNode
			if mode == v1alpha1.MigrationModePaused {
				// The guest was paused to converge and did not leave: it must run on here.
				if err := mg.Resume(name); err != nil {
					log.Error("resuming the guest after a failed migration", "err", err)
				}
			}
		default:
			where = fmt.Sprintf("the guest is no longer on node %s, and node %s never reported it running", mig.Status.SourceNode, mig.Status.TargetNode)
			if seen.SourceExit != nil {
				where = fmt.Sprintf("the source launcher on node %s ended with exit code %d before its guest left, and node %s never reported it running",
					mig.Status.SourceNode, *seen.SourceExit, mig.Status.TargetNode)
			}
		}
	}
	fw.finish(result == nil)
	if result != nil {
		m.a.handovers.Delete(string(vmi.UID))
	}
	m.record(mig, vmi, mode, result, where)
}

// remoteReadInterval is how often a failed call's wait reads what the API server holds: the
// target's record and the source launcher's exit code.
const remoteReadInterval = 500 * time.Millisecond

// afterFailedCall finds out what a migration whose libvirt call failed did, from the source
// launcher's reports and its libvirt (mg), its exit code and what the target agent recorded on
// the VMI, waiting for their word within DecideFailedCall's bounds.
func (m *migrations) afterFailedCall(mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, mg Migrator, name string, start time.Time, mode v1alpha1.MigrationMode) (CallOutcome, FailedCall) {
	uid := string(vmi.UID)
	clk := m.a.cfg.Clock
	failed := clk.Now()
	var targetRan bool
	var exit *int32
	var remoteRead time.Time
	tick := clk.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		c := FailedCall{
			LeftByMigration: m.a.migratedAwaySince(uid, start),
			PostCopy:        mode == v1alpha1.MigrationModePostCopy,
			Waited:          clk.Since(failed),
		}
		if !c.LeftByMigration && clk.Since(remoteRead) >= remoteReadInterval {
			remoteRead = clk.Now()
			targetRan = targetRan || m.targetRan(mig, vmi)
			if pod := vmi.Status.LauncherPod; pod != nil && m.a.cfg.LauncherExit != nil && exit == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				exit, _ = m.a.cfg.LauncherExit(ctx, vmi.Namespace, pod.Name, pod.UID)
				cancel()
			}
		}
		c.TargetRan, c.SourceExit = targetRan, exit
		c.SourceSilent = m.a.conn(uid) == nil || m.a.notifyConns.allRead(uid)
		state, reason, err := mg.State(name)
		c.SourceAlive = err == nil && stateOf(state, reason).Alive()
		c.SourceRunning = err == nil && state == domain.Running
		if outcome := DecideFailedCall(c); outcome != OutcomeWait {
			return outcome, c
		}
		<-tick.C()
	}
}

// targetRan reports whether the target agent recorded the guest running in the target launcher
// of mig: fresh from the API server, since the target agent writes it a moment before the source
// learns anything, and this agent's cache may be behind.
func (m *migrations) targetRan(mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Get(ctx, vmi.Name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	s := v.Status.MigrationState
	return s != nil && s.MigrationUID == string(mig.UID) && s.TargetNodeDomainReadyTimestamp != nil
}

// tightened follows the VMI's evacuation deadline from the source node while the migration runs:
// a SIGTERM that comes during a migration without a deadline (or with a later one) sets an
// earlier one, which the migration must now meet. It records each earlier deadline on the
// migration, with an Event, and returns the earliest known (zero for none).
func (m *migrations) tightened(mig *v1alpha1.VirtualMachineInstanceMigration, uid string, start time.Time) func() time.Time {
	known := start
	return func() time.Time {
		vmi := m.a.cachedVMI(uid)
		if vmi == nil {
			return known
		}
		d := vmi.Status.EvacuationDeadline
		if vmi.Status.EvacuationNodeName != mig.Status.SourceNode || d == nil || (!known.IsZero() && !d.Before(&metav1.Time{Time: known})) {
			return known
		}
		known = d.Time
		m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeNormal, "DeadlineTightened", "the VM must now leave node %s by %s (%s)",
			mig.Status.SourceNode, d.UTC().Format(time.RFC3339), cmp.Or(vmi.EvacuationCause(), "no cause recorded"))
		err := m.updateMigration(context.Background(), mig.Namespace, mig.Name, func(x *v1alpha1.VirtualMachineInstanceMigration) { x.Status.Deadline = d.DeepCopy() })
		if err != nil {
			m.a.cfg.Log.Warn("recording a tightened deadline on the migration", "migration", mig.Name, "err", err)
		}
		return known
	}
}

// markCleared reports whether an evacuation's reason went away: its VMI is no longer marked for
// evacuation from the source node (someone cancelled the evacuation).
func (m *migrations) markCleared(mig *v1alpha1.VirtualMachineInstanceMigration, uid string) bool {
	if mig.EvacuatedVMI() == "" {
		return false
	}
	vmi := m.a.cachedVMI(uid)
	return vmi != nil && vmi.Status.NodeName == mig.Status.SourceNode && vmi.Status.EvacuationNodeName != mig.Status.SourceNode
}

// publishProgress writes a running migration's transfer figures on its status, for people
// watching it; a failed write only delays the next figures.
func (m *migrations) publishProgress(mig *v1alpha1.VirtualMachineInstanceMigration, stats *domain.JobStats) {
	progress := &v1alpha1.MigrationProgress{
		DataTotal: int64(stats.DataTotal), DataRemaining: int64(stats.DataRemaining),
		MemoryDirtyRate: int64(stats.MemoryDirtyRate), MemoryBandwidth: int64(stats.MemoryBandwidth), UpdateTime: metav1.Now(),
	}
	err := m.updateMigration(context.Background(), mig.Namespace, mig.Name, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		if !x.Status.Phase.Terminal() {
			x.Status.Progress = progress
		}
	})
	if err != nil {
		m.a.cfg.Log.Warn("publishing a migration's progress", "migration", mig.Namespace+"/"+mig.Name, "err", err)
	}
}

// record writes the outcome on the migration and the VMI. On failure the mark stays, so the
// evacuation controller retries, and where says where the guest is then, as far as this agent
// knows.
func (m *migrations) record(mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, mode v1alpha1.MigrationMode, result error, where string) {
	ctx := context.Background()
	now := metav1.Now()
	reason := ""
	if result != nil {
		reason = result.Error()
		if errors.Is(result, context.Canceled) {
			reason = "cancelled: " + reason
		}
	}
	// The cause may have been recorded after this agent's copy of the migration was taken. The
	// informer's copy has it unless it lags, and only then is it read afresh: a read at every
	// migration's end would hold back, by a round trip, the next migration that waits for this
	// one's slot.
	if cached := m.cachedMigration(mig.Namespace, mig.Name); cached != nil && cached.UID == mig.UID && cached.Status.Cause != "" {
		mig = cached
	} else if fresh, err := m.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(mig.Namespace).Get(ctx, mig.Name, metav1.GetOptions{}); err == nil {
		mig = fresh
	}
	// The VMI first: once the migration reads finished, the evacuation controller must already
	// see the VM where it now is, or it would start another migration for the old mark.
	err := m.updateVMI(ctx, vmi.Namespace, vmi.Name, func(v *v1alpha1.VirtualMachineInstance) {
		if s := v.Status.MigrationState; s != nil && s.MigrationUID == string(mig.UID) {
			s.EndTimestamp, s.Mode, s.Completed, s.Failed = &now, mode, result == nil, result != nil
			s.Cause = mig.Status.Cause
		}
		if result == nil {
			clearMark(v, mig, now)
		}
	})
	if err != nil {
		m.a.cfg.Log.Error("recording the end of a migration on its VMI", "vmi", vmi.Name, "err", err)
	}
	err = m.updateMigration(ctx, mig.Namespace, mig.Name, func(x *v1alpha1.VirtualMachineInstanceMigration) {
		x.Status.EndTimestamp, x.Status.Mode = &now, mode
		if result == nil {
			setMigrationPhase(x, v1alpha1.MigrationSucceeded)
		} else {
			setMigrationPhase(x, v1alpha1.MigrationFailed)
			x.Status.FailureReason = reason
		}
	})
	if err != nil {
		m.a.cfg.Log.Error("recording the end of a migration", "migration", mig.Name, "err", err)
	}
	if result == nil {
		m.a.cfg.Recorder.Eventf(vmi, corev1.EventTypeNormal, "Migrated", "moved from node %s to node %s (%s, cause %s)", mig.Status.SourceNode, mig.Status.TargetNode, mode, mig.Status.Cause)
		m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeNormal, "MigrationSucceeded", "the guest runs on node %s", mig.Status.TargetNode)
		return
	}
	m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeWarning, "MigrationFailed", "%s; %s", reason, where)
}

// MaxDowntime is QEMU's downtime target for lifeboat's migrations: the longest it may stop the
// guest for the final copy of a pre-copy. The guest stands still for that and then until the
// destination's libvirt has it run, which QEMU's figure does not count; lifeboat's goal is what
// the guest sees, at most QEMU's default of 300 ms, so QEMU is given less
// (BenchmarkDowntimeTarget in test/bench measures both).
const MaxDowntime = 100 * time.Millisecond

// WithConvergence is o with what the convergence policy sets on libvirt's migration: the
// bandwidth cap, auto-converge and post-copy as allowed, and synchronous writes where disks are
// copied (a guest writing its disk faster than the copy would otherwise keep the memory transfer
// from starting before any deadline: the deadline matrix's disk cells). The agent and the
// deadline matrix both migrate with it, so the matrix measures what the agent does.
//
// Without post-copy the guest arrives paused, and the source launcher's hand-off runs it there
// once the source gave it up (domain.HandOff): no moment with two copies running, at the cost of
// the source QEMU's end inside the guest's stop. libvirt cannot do it with post-copy allowed: a
// migration that may switch to post-copy and then ends in pre-copy keeps libvirt's own order,
// where a confirmation lost between the nodes leaves the guest running on both.
func WithConvergence(o domain.MigrateOptions, allowed Allowed, bandwidth uint64) domain.MigrateOptions {
	o.Bandwidth, o.AutoConverge, o.AllowPostCopy = bandwidth, allowed.AutoConverge, allowed.PostCopy
	o.MaxDowntime = MaxDowntime
	o.SynchronousDiskWrites = o.DisksURI != ""
	o.PausedOnArrival = !allowed.PostCopy
	return o
}

// MigrationSettings are the LifeboatConfig's convergence switches and bandwidth cap, with the
// API's defaults when there is no configuration, narrowed by the VMI's own opt-out (vmi may be nil).
func MigrationSettings(config *v1alpha1.LifeboatConfig, vmi *v1alpha1.VirtualMachineInstance) (Allowed, uint64) {
	allowed := Allowed{AutoConverge: true, Pause: true}
	if config == nil {
		return allowed, 0
	}
	c := config.Spec.Migrations
	if c.AllowAutoConverge != nil {
		allowed.AutoConverge = *c.AllowAutoConverge
	}
	allowed.PostCopy = v1alpha1.PostCopyAllowed(config, vmi)
	if c.AllowPause != nil {
		allowed.Pause = *c.AllowPause
	}
	var bandwidth uint64
	if c.BandwidthPerMigration != nil && c.BandwidthPerMigration.Value() > 0 {
		bandwidth = uint64(c.BandwidthPerMigration.Value())
	}
	return allowed, bandwidth
}

// residentBounds says whether guests' resident memory bounds what they have in use here: only
// where the node has no swap.
func (a *Agent) residentBounds(log *slog.Logger) bool {
	if a.cfg.NodeSwap == nil {
		return false
	}
	swap, err := a.cfg.NodeSwap()
	switch {
	case err != nil:
		log.Warn("the node's swap space cannot be read: the first pass counts all of its rest in use", "err", err)
		return false
	case swap > 0:
		log.Info("the node has swap, which may hold guest memory: the first pass counts all of its rest in use", "swapBytes", swap)
		return false
	}
	return true
}
