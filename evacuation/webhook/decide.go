// Package webhook is the eviction admission webhook (seed 000): lifeboat-controller serves it over
// TLS for pods/eviction CREATE. An eviction of a VM's launcher pod marks the VM for evacuation and
// answers 429 while the VM is live-migrated, or lets the eviction through to the pod's disruption
// budget, per the VM's eviction strategy.
package webhook

import (
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Answer is what the webhook said, a metric label.
type Answer string

const (
	// AnswerAllowed: the eviction goes on to the pod's disruption budget.
	AnswerAllowed Answer = "allowed"
	// AnswerEvacuating: the VM was (or, in a dry run, would be) marked for evacuation; 429.
	AnswerEvacuating Answer = "evacuating"
	// AnswerInProgress: the VM is already marked; 429.
	AnswerInProgress Answer = "in-progress"
	// AnswerDenied: the VM cannot leave its node now; 429.
	AnswerDenied Answer = "denied"
	// AnswerBounded: the review, which the webhook could not authenticate, asked for more than
	// such a review may cause (Unauthenticated); 429, nothing changed.
	AnswerBounded Answer = "bounded"
)

// Decision is the webhook's answer to one eviction.
type Decision struct {
	Answer Answer
	// Mark says to mark the VMI for evacuation (never in a dry run).
	Mark bool
	// Message explains a 429; the descheduler looks for EvacuationText in it.
	Message string
}

// Allowed reports whether the eviction may go on.
func (d Decision) Allowed() bool { return d.Answer == AnswerAllowed }

// Code is the HTTP status the API server answers the evictor with, when the webhook refuses.
func (d Decision) Code() int32 {
	if d.Allowed() {
		return http.StatusOK
	}
	return http.StatusTooManyRequests
}

// EvacuationText starts the message of every 429 that stands for an evacuation (seed 003): the
// descheduler reads it as a promise that the pod will go.
const EvacuationText = "Eviction triggered evacuation of VMI"

// Decide is seed 000's webhook table. pod is nil when the evicted pod is not a launcher pod; vmi
// is nil when the launcher's VMI is gone; config may be nil.
func Decide(pod *corev1.Pod, vmi *v1alpha1.VirtualMachineInstance, config *v1alpha1.LifeboatConfig, dryRun bool) Decision {
	allow := Decision{Answer: AnswerAllowed}
	if pod == nil || vmi == nil || vmi.Status.Phase.Terminal() || vmi.DeletionTimestamp != nil {
		return allow
	}
	// A launcher pod that does not run the guest (one that has ended, or a migration's target) is
	// left to its disruption budget, which covers the target while the migration lasts.
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed ||
		(vmi.Status.NodeName != "" && pod.Spec.NodeName != vmi.Status.NodeName) {
		return allow
	}
	key := vmi.Namespace + "/" + vmi.Name
	strategy := v1alpha1.EffectiveEvictionStrategy(vmi, config)
	migratable, why := vmi.LiveMigratable()
	switch {
	case strategy == v1alpha1.EvictionStrategyLiveMigrate && !migratable:
		return Decision{Answer: AnswerDenied, Message: fmt.Sprintf(
			"VMI %q has eviction strategy LiveMigrate but cannot be live-migrated (%s): its pod may not be evicted", key, why)}
	case strategy == v1alpha1.EvictionStrategyExternal && vmi.Status.NodeName == "":
		return Decision{Answer: AnswerDenied, Message: fmt.Sprintf(
			"VMI %q has eviction strategy External but is not on a node yet, so it cannot be marked for evacuation; try again", key)}
	case strategy == v1alpha1.EvictionStrategyLiveMigrate,
		strategy == v1alpha1.EvictionStrategyLiveMigrateIfPossible && migratable,
		strategy == v1alpha1.EvictionStrategyExternal:
	default: // None, LiveMigrateIfPossible when not migratable, or a strategy this version does not know
		return allow
	}
	if vmi.MarkedForEvacuation() {
		return Decision{Answer: AnswerInProgress, Message: fmt.Sprintf(
			"Evacuation in progress: %s %q from node %s", EvacuationText, key, vmi.Status.NodeName)}
	}
	msg := fmt.Sprintf("%s %q: it is marked for evacuation from node %s", EvacuationText, key, vmi.Status.NodeName)
	if strategy == v1alpha1.EvictionStrategyExternal {
		msg += "; its eviction strategy External leaves the move to an external controller"
	} else {
		msg += " and will be live-migrated; its pod ends once the VM has left"
	}
	return Decision{Answer: AnswerEvacuating, Mark: !dryRun, Message: msg}
}
