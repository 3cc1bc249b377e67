// Package migration is the migration controller: for each VirtualMachineInstanceMigration it
// creates a target launcher pod off the source node and moves the migration's phase until the
// agents take over (the target agent: PreparingTarget → TargetReady; the source agent: Running →
// Succeeded or Failed). It cleans up after failed and cancelled migrations.
package migration

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// Action is what the controller does besides writing the status.
type Action int

const (
	// NoAction: only the status (if it changed).
	NoAction Action = iota
	// CreateTargetPod: the migration needs its target pod.
	CreateTargetPod
	// DeleteTargetPod: the migration failed or was cancelled; its target pod must go.
	DeleteTargetPod
)

// Event is a Kubernetes Event for the migration.
type Event struct{ Type, Reason, Message string }

// Next is the migration's next status from what the cluster shows: its VMI (nil if gone) and
// its target pod (nil if none); a target that does not run within limits (or by the deadline),
// or is not ready by its TargetReadyBy, fails it. Phases the agents own (PreparingTarget onwards) are left to them.
func Next(m *v1alpha1.VirtualMachineInstanceMigration, v *v1alpha1.VirtualMachineInstance, target *corev1.Pod, limits Limits, now metav1.Time) (v1alpha1.VirtualMachineInstanceMigrationStatus, Action, []Event) {
	status := *m.Status.DeepCopy()
	fail := func(reason string) (v1alpha1.VirtualMachineInstanceMigrationStatus, Action, []Event) {
		return failed(status, target, "MigrationFailed", reason, now)
	}
	switch {
	case status.Phase != v1alpha1.MigrationSucceeded && GuestInTarget(m, v):
		// The target launcher runs the guest: deleting its pod, or failing the migration for what
		// the source shows (its pod gone as the guest left), would lose the VM. The source agent
		// records the outcome.
		return status, NoAction, nil
	case status.Phase == v1alpha1.MigrationFailed:
		if target != nil && target.DeletionTimestamp == nil {
			return status, DeleteTargetPod, nil
		}
		return status, NoAction, nil
	case status.Phase == v1alpha1.MigrationSucceeded:
		return status, NoAction, nil
	case v == nil:
		return fail(fmt.Sprintf("VMI %s does not exist", m.Spec.VMIName))
	case v.Status.Phase != v1alpha1.VMIRunning:
		return fail(fmt.Sprintf("VMI %s is %s, not Running", v.Name, v.Status.Phase))
	case target != nil && target.Status.Phase == corev1.PodFailed:
		return fail(fmt.Sprintf("target pod %s failed: %s", target.Name, vmi.PodFailureMessage(target)))
	}
	if reason, _ := Stalled(m, target, limits, now.Time); reason != "" {
		status.TargetUnschedulable = target != nil && unschedulable(target)
		return fail(reason)
	}
	if reason, _ := TargetLate(m, target, v.Spec.Memory, limits.Bandwidth, now.Time); reason != "" {
		status.TargetUnschedulable = target != nil && unschedulable(target)
		return failed(status, target, ReasonTargetNotReadyInTime, reason, now)
	}

	switch status.Phase {
	case "", v1alpha1.MigrationPending:
		// Whoever made it (a person's Manual migration included), a VM its agent found not
		// live-migratable is not moved: its disks would stay behind or be shared unsafely.
		if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c != nil && c.Status == metav1.ConditionFalse {
			// No node to take it: the evacuation controller retries when the nodes change.
			status.TargetUnschedulable = c.Reason == v1alpha1.VMIReasonNoTargetNode
			return fail(fmt.Sprintf("VMI %s cannot be live-migrated (%s): %s", v.Name, c.Reason, c.Message))
		}
		if status.SourceNode == "" {
			status.SourceNode = v.Status.NodeName
		}
		if status.Cause == "" {
			status.Cause, status.Deadline = requested(m)
		}
		if target == nil {
			setPhase(&status, v1alpha1.MigrationPending, now)
			return status, CreateTargetPod, nil
		}
		setPhase(&status, v1alpha1.MigrationScheduling, now)
		// By UID too: the target node's agent binds the migration to this pod only.
		status.TargetPod, status.TargetPodUID = target.Name, target.UID
		return status, NoAction, []Event{{corev1.EventTypeNormal, "TargetPodCreated", "created target pod " + target.Name}}
	case v1alpha1.MigrationScheduling:
		if target == nil {
			return fail("the target pod was deleted")
		}
		if target.Spec.NodeName == "" {
			// A target the scheduler has not placed, for a VM no other node can take now: it
			// would only wait out the pending timeout.
			if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c != nil &&
				c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.VMIReasonNoTargetNode {
				status.TargetUnschedulable = true
				return fail(fmt.Sprintf("target pod %s cannot be scheduled: %s", target.Name, c.Message))
			}
			return status, NoAction, nil
		}
		setPhase(&status, v1alpha1.MigrationScheduled, now)
		status.TargetNode = target.Spec.NodeName
		return status, NoAction, []Event{{corev1.EventTypeNormal, "TargetScheduled", "target pod " + target.Name + " scheduled to node " + target.Spec.NodeName}}
	case v1alpha1.MigrationScheduled:
		if target == nil {
			return fail("the target pod was deleted")
		}
		if target.Status.Phase != corev1.PodRunning {
			return status, NoAction, nil
		}
		setPhase(&status, v1alpha1.MigrationPreparingTarget, now)
		return status, NoAction, []Event{{corev1.EventTypeNormal, "PreparingTarget", "the target launcher runs on " + status.TargetNode + "; its agent prepares to receive the guest"}}
	}
	if target == nil && !status.Phase.Terminal() {
		return fail("the target pod was deleted")
	}
	return status, NoAction, nil
}

// GuestInTarget reports whether m's target agent recorded the guest running in m's target
// launcher (v may be nil).
func GuestInTarget(m *v1alpha1.VirtualMachineInstanceMigration, v *v1alpha1.VirtualMachineInstance) bool {
	if v == nil {
		return false
	}
	s := v.Status.MigrationState
	return s != nil && s.MigrationUID == string(m.UID) && s.TargetNodeDomainReadyTimestamp != nil
}

// Refused ends status, Next's for a migration about to get its target pod, as Failed at once:
// Admit refused it.
func Refused(status v1alpha1.VirtualMachineInstanceMigrationStatus, refusal *Refusal, now metav1.Time) (v1alpha1.VirtualMachineInstanceMigrationStatus, Action, []Event) {
	return failed(status, nil, ReasonRefused, refusal.Reason, now)
}

// failed ends status as Failed for reason, with a Warning Event of eventReason; the target pod,
// if any, must go.
func failed(status v1alpha1.VirtualMachineInstanceMigrationStatus, target *corev1.Pod, eventReason, reason string, now metav1.Time) (v1alpha1.VirtualMachineInstanceMigrationStatus, Action, []Event) {
	setPhase(&status, v1alpha1.MigrationFailed, now)
	status.FailureReason, status.EndTimestamp = reason, &now
	action := NoAction
	if target != nil {
		action = DeleteTargetPod
	}
	return status, action, []Event{{corev1.EventTypeWarning, eventReason, reason}}
}

// requested is the cause and deadline its creator put on a migration; a migration without them
// was made by a person.
func requested(m *v1alpha1.VirtualMachineInstanceMigration) (v1alpha1.MigrationCause, *metav1.Time) {
	cause := v1alpha1.MigrationCauseManual
	if c := v1alpha1.MigrationCause(m.Annotations[v1alpha1.AnnotationCause]); c.Recorded() {
		cause = c
	}
	var deadline *metav1.Time
	if t, err := time.Parse(time.RFC3339, m.Annotations[v1alpha1.AnnotationDeadline]); err == nil {
		deadline = &metav1.Time{Time: t}
	}
	return cause, deadline
}

// setPhase moves the phase and records when.
func setPhase(status *v1alpha1.VirtualMachineInstanceMigrationStatus, p v1alpha1.VirtualMachineInstanceMigrationPhase, now metav1.Time) {
	if status.Phase == p {
		return
	}
	status.Phase = p
	status.PhaseTransitionTimestamps = append(status.PhaseTransitionTimestamps, v1alpha1.MigrationPhaseTransition{Phase: p, Timestamp: now})
}
