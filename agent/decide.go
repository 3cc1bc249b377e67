// Package agent is lifeboat's node agent: it finds the launchers on its node, watches their
// domains, keeps their VMIs' status true and decides how each guest ends.
package agent

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// DomainState is the agent's view of a domain's life.
type DomainState string

const (
	DomainRunning      DomainState = "Running"
	DomainPaused       DomainState = "Paused"
	DomainShuttingDown DomainState = "ShuttingDown"
	DomainShutoff      DomainState = "Shutoff"
	DomainCrashed      DomainState = "Crashed"
)

// Alive reports whether the guest still exists in memory (seed 001's domainIsAlive).
func (s DomainState) Alive() bool {
	return s == DomainRunning || s == DomainPaused || s == DomainShuttingDown
}

// Domain is what the agent knows of a VMI's domain.
type Domain struct {
	State DomainState
	// GracefulShutdown is when the launcher received SIGTERM, as recorded in the domain's
	// metadata, so it survives an agent restart; nil if it has not.
	GracefulShutdown *time.Time
	// NotMigratableReason is empty when the guest can be live-migrated.
	NotMigratableReason string
	// ShutdownSent is true once this agent pressed the guest's power button.
	ShutdownSent bool
}

// Plan is what the agent does for one VMI after observing it.
type Plan struct {
	// Status, if not nil, is the VMI status to write.
	Status *v1alpha1.VirtualMachineInstanceStatus
	// Shutdown presses the guest's ACPI power button; Destroy pulls its plug.
	Shutdown, Destroy bool
	// RequeueAfter, if positive, asks to look again then (the destroy deadline).
	RequeueAfter time.Duration
	Events       []Event
}

// Event is a Kubernetes Event for the VMI.
type Event struct{ Type, Reason, Message string }

// Event reasons and condition reasons the agent uses.
const (
	ReasonStarted         = "Started"
	ReasonShuttingDown    = "ShuttingDown"
	ReasonDestroyed       = "Destroyed"
	ReasonGuestCrashed    = "GuestCrashed"
	ReasonGuestRunning    = "GuestRunning"
	ReasonGuestNotRunning = "GuestNotRunning"
	ReasonMigratable      = "Migratable"
)

// NotMigratableReason says why a VMI cannot be live-migrated, or "" if it can. A disk image is a
// file on the node: lifeboat does not copy storage, so only diskless (kernel-booted) guests move.
func NotMigratableReason(vmi *v1alpha1.VirtualMachineInstance) string {
	if vmi.Spec.Boot.Disk != "" {
		return "LocalDisk"
	}
	return ""
}

// defaultGuestGrace is used when a VMI sets no grace period (KubeVirt's default).
const defaultGuestGrace = 30 * time.Second

// Decide is the agent's reconcile decision for one VMI on this node. vmi is never nil; dom is
// nil when the agent has no domain for it (not started yet, or gone).
func Decide(vmi *v1alpha1.VirtualMachineInstance, dom *Domain, node string, now time.Time) Plan {
	var plan Plan
	if dom == nil || isTerminal(vmi.Status.Phase) {
		return plan
	}
	status := vmi.Status.DeepCopy()
	nowMeta := metav1.NewTime(now)

	switch {
	case dom.State == DomainCrashed:
		status.Phase = v1alpha1.VMIFailed
		status.Reason, status.Message = ReasonGuestCrashed, "the guest crashed"
		setCondition(status, v1alpha1.VMIConditionReady, metav1.ConditionFalse, ReasonGuestCrashed, status.Message, nowMeta)
		plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonGuestCrashed, "the guest crashed on node " + node})
	case dom.State.Alive():
		if vmi.Status.Phase != v1alpha1.VMIRunning {
			plan.Events = append(plan.Events, Event{corev1.EventTypeNormal, ReasonStarted, "the guest runs on node " + node})
		}
		status.Phase = v1alpha1.VMIRunning
		status.NodeName = node
		setCondition(status, v1alpha1.VMIConditionReady, metav1.ConditionTrue, ReasonGuestRunning, "", nowMeta)
		if dom.NotMigratableReason == "" {
			setCondition(status, v1alpha1.VMIConditionLiveMigratable, metav1.ConditionTrue, ReasonMigratable, "", nowMeta)
		} else {
			setCondition(status, v1alpha1.VMIConditionLiveMigratable, metav1.ConditionFalse, dom.NotMigratableReason,
				"the guest cannot be live-migrated: "+dom.NotMigratableReason, nowMeta)
		}
		if start, why, ok := shutdownStart(vmi, dom); ok {
			deadline := start.Add(guestGrace(vmi))
			switch {
			case !now.Before(deadline):
				plan.Destroy = true
				plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonDestroyed,
					fmt.Sprintf("the guest did not power off within its grace period (%s) and was destroyed", guestGrace(vmi))})
			case !dom.ShutdownSent:
				plan.Shutdown = true
				plan.RequeueAfter = deadline.Sub(now)
				plan.Events = append(plan.Events, Event{corev1.EventTypeNormal, ReasonShuttingDown,
					fmt.Sprintf("%s: pressing the guest's power button; it is destroyed at %s", why, deadline.UTC().Format(time.RFC3339))})
			default:
				plan.RequeueAfter = deadline.Sub(now)
			}
		}
	default:
		setCondition(status, v1alpha1.VMIConditionReady, metav1.ConditionFalse, ReasonGuestNotRunning, "the guest is "+string(dom.State), nowMeta)
	}
	plan.Status = status
	return plan
}

// shutdownStart says whether the guest must be shut down and from when its grace period runs:
// the user deleted the VMI, or the launcher was told to stop (SIGTERM).
func shutdownStart(vmi *v1alpha1.VirtualMachineInstance, dom *Domain) (time.Time, string, bool) {
	if vmi.DeletionTimestamp != nil {
		return vmi.DeletionTimestamp.Time, "the VMI is being deleted", true
	}
	if dom.GracefulShutdown != nil {
		return *dom.GracefulShutdown, "the launcher received SIGTERM", true
	}
	return time.Time{}, "", false
}

func guestGrace(vmi *v1alpha1.VirtualMachineInstance) time.Duration {
	if vmi.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*vmi.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return defaultGuestGrace
}

func isTerminal(p v1alpha1.VirtualMachineInstancePhase) bool {
	return p == v1alpha1.VMISucceeded || p == v1alpha1.VMIFailed
}

// setCondition keeps the transition time of a condition whose status did not change, so a
// status write happens only when something a reader cares about changed.
func setCondition(status *v1alpha1.VirtualMachineInstanceStatus, typ string, s metav1.ConditionStatus, reason, msg string, now metav1.Time) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, LastTransitionTime: now})
}
