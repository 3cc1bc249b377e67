package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// Recovery is what a source agent does with a running migration it does not drive: it was
// restarted (or crashed) while the migration ran, and its proxies, and so the migration's
// connections, died with it.
type Recovery int

const (
	// RecoveryWait: look again soon (libvirt still ends the broken job, or the launcher has not
	// reconnected yet).
	RecoveryWait Recovery = iota
	// RecoveryFailed: the guest is still on the source; the migration failed.
	RecoveryFailed
	// RecoverySucceeded: the guest left the source; it runs on the target.
	RecoverySucceeded
	// RecoveryResumePostCopy: the migration broke in post-copy, so the guest's memory is split
	// between the nodes and neither can run it; the agent resumes the migration.
	RecoveryResumePostCopy
)

// Orphan is what the restarted source agent observes of such a migration.
type Orphan struct {
	// Connected: the agent holds a connection to the source launcher's libvirt.
	Connected bool
	// JobActive: libvirt still runs a job (the broken migration) on the domain.
	JobActive bool
	// Domain is the domain's state; "" when the launcher's libvirt has no such domain.
	Domain DomainState
	// PostCopyBroken: libvirt says the domain waits paused because its post-copy migration
	// broke (reason PostcopyFailed).
	PostCopyBroken bool
	// LauncherExit is the source launcher's exit code once it ended; nil while it runs.
	LauncherExit *int32
	// Mode is the last mode the migration recorded.
	Mode v1alpha1.MigrationMode
	// TargetRan: the target agent recorded the guest running in the target launcher.
	TargetRan bool
}

// RecoverSource decides the outcome of an orphaned migration from libvirt and the pod, and
// whether the guest, paused to converge, must be resumed where it is.
func RecoverSource(o Orphan) (outcome Recovery, resume bool) {
	switch {
	case o.TargetRan && o.Mode != v1alpha1.MigrationModePostCopy:
		// The target's libvirt resumed the guest: the migration finished, whatever the source
		// still shows (a paused guest it had yet to stop, or a launcher gone with its pod).
		return RecoverySucceeded, false
	case o.Connected && o.PostCopyBroken:
		// Only finishing the migration saves the guest. libvirt may still hold the broken job
		// a moment; the resume retries through that.
		return RecoveryResumePostCopy, false
	case o.Connected && o.JobActive:
		return RecoveryWait, false
	case o.Connected && o.Domain.Alive():
		// A guest the agent paused to converge stays paused after a failed migration.
		return RecoveryFailed, o.Domain == DomainPaused && o.Mode == v1alpha1.MigrationModePaused
	case o.Connected:
		// The launcher's libvirt no longer has the guest: it left by migration (the launcher
		// exits once its domain is gone).
		return RecoverySucceeded, false
	case o.LauncherExit == nil:
		return RecoveryWait, false
	case *o.LauncherExit == 0:
		// A source launcher exits 0 once its guest has left by migration.
		return RecoverySucceeded, false
	default:
		return RecoveryFailed, false
	}
}

// orphanRetry is how often an orphaned migration is looked at while its outcome is unknown.
const orphanRetry = 2 * time.Second

// recoverSource ends a migration from this node that no goroutine of this agent drives.
func (m *migrations) recoverSource(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration) (time.Duration, error) {
	m.mu.Lock()
	_, running := m.active[string(mig.UID)]
	m.mu.Unlock()
	if running {
		return 0, nil
	}
	uid, vmi, err := m.vmiUID(ctx, mig)
	if apierrors.IsNotFound(err) {
		// Its VM was deleted (or is being started again as a new VMI): nothing is left to move.
		gone := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: mig.Namespace, Name: mig.Spec.VMIName}}
		m.record(mig, gone, mig.Status.Mode, fmt.Errorf("VMI %s is gone", mig.Spec.VMIName), "")
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if s := vmi.Status.MigrationState; s == nil || s.MigrationUID != string(mig.UID) {
		// The VMI of that name is another instance (its VM started again elsewhere), or this
		// migration never got as far as recording itself on it: this migration moves nothing.
		m.record(mig, vmi, mig.Status.Mode, fmt.Errorf("VMI %s (UID %s) does not record this migration: its VM was started again, or the migration never began", vmi.Name, vmi.UID), "")
		return 0, nil
	}
	name := domain.DomainName(vmi.Namespace, vmi.Name)
	o := Orphan{Mode: mig.Status.Mode, TargetRan: m.targetRan(mig, vmi)}
	if conn, mg := m.a.conn(uid), m.a.migrator(uid); conn != nil && mg != nil {
		o.Connected = true
		dom, err := conn.Observe(ctx, name)
		if err != nil {
			return 0, fmt.Errorf("observing domain %s: %w", name, err)
		}
		if dom != nil {
			o.Domain = dom.State
		}
		if stats, err := mg.JobStats(name); err == nil {
			o.JobActive = stats.Type == domain.JobUnbounded || stats.Type == domain.JobBounded
		}
		if state, reason, err := mg.State(name); err == nil {
			o.PostCopyBroken = state == domain.Paused && reason == domain.ReasonPostcopyFailed
		}
	} else if pod := vmi.Status.LauncherPod; m.a.cfg.LauncherExit != nil && pod != nil {
		// The source launcher is the pod the VMI records, not any pod labelled for it.
		if o.LauncherExit, err = m.a.cfg.LauncherExit(ctx, vmi.Namespace, pod.Name, pod.UID); err != nil {
			return 0, fmt.Errorf("reading how the source launcher of %s ended: %w", vmi.Name, err)
		}
	}
	outcome, resume := RecoverSource(o)
	log := m.a.cfg.Log.With("migration", mig.Namespace+"/"+mig.Name, "vmi", vmi.Name)
	switch outcome {
	case RecoveryWait:
		return orphanRetry, nil
	case RecoveryResumePostCopy:
		return 0, m.resumeOrphan(mig, vmi, uid, name, log)
	case RecoverySucceeded:
		log.Info("recovered a migration this agent no longer drove: the guest left this node")
		m.record(mig, vmi, o.Mode, nil, "")
	case RecoveryFailed:
		if mg := m.a.migrator(uid); resume && mg != nil {
			if err := mg.Resume(name); err != nil {
				return 0, fmt.Errorf("resuming the guest after a broken migration: %w", err)
			}
		}
		where := "the guest keeps running on node " + m.a.cfg.NodeName
		if !o.Domain.Alive() {
			where = "the source launcher ended without its guest leaving by migration"
		}
		log.Warn("recovered a migration this agent no longer drove: the guest did not leave this node", "resumed", resume, "where", where)
		m.record(mig, vmi, o.Mode, fmt.Errorf("the source agent on node %s restarted during the migration, which broke its connections", m.a.cfg.NodeName), where)
	}
	return 0, nil
}

// errAgentRestarted is why a migration that this agent resumes after its restart had broken.
var errAgentRestarted = errors.New("the source agent restarted during the post-copy migration, which broke its connections")

// resumeOrphan carries on, over new proxies, a post-copy migration whose connections died with
// this agent's previous process, and records how it ends.
func (m *migrations) resumeOrphan(mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, uid, name string, log *slog.Logger) error {
	mg := m.a.migrator(uid)
	if mg == nil || mig.Status.TargetProxy == nil {
		return fmt.Errorf("resuming the post-copy migration of %s: the source launcher or the target's proxies are unknown", vmi.Name)
	}
	ctx, err := m.openSourceProxies(mig, vmi, uid)
	if err != nil {
		return err
	}
	log.Warn("a post-copy migration broke when this agent restarted; resuming it")
	m.a.cfg.Recorder.Eventf(mig, corev1.EventTypeWarning, "PostCopyResuming",
		"the post-copy migration broke when the agent on node %s restarted; resuming it to node %s", m.a.cfg.NodeName, mig.Status.TargetNode)
	go func() {
		defer m.finish(string(mig.UID))
		allowed, bandwidth := MigrationSettings(m.a.eviction().Config, vmi)
		c := ConvergingMigration{Migrator: loopMigrator(mg), Domain: name, Options: sourceOptions(vmi, mg, allowed, bandwidth), Clock: m.a.cfg.Clock, Log: log}
		m.record(mig, vmi, v1alpha1.MigrationModePostCopy, c.resumePostCopy(ctx, errAgentRestarted),
			"the guest waits paused on node "+m.a.cfg.NodeName+" with part of its memory on node "+mig.Status.TargetNode)
	}()
	return nil
}
