package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Descheduler annotations (descheduler KEP-1397, evictions in background).
const (
	// AnnotationRequestEvictOnly on a launcher pod tells the descheduler that an eviction of the pod
	// only starts its VM's evacuation: a 429 mentioning "Eviction triggered evacuation" is a promise.
	AnnotationRequestEvictOnly = "descheduler.alpha.kubernetes.io/request-evict-only"
	// AnnotationEvictionInProgress is on a VM's source launcher pod while the VM is marked for evacuation.
	AnnotationEvictionInProgress = "descheduler.alpha.kubernetes.io/eviction-in-progress"
	// AnnotationCancelEvacuation on a VMI asks lifeboat to cancel its evacuation (docs/operations.md).
	AnnotationCancelEvacuation = "lifeboat.dev/cancel-evacuation"
)

// MarkedForEvacuation reports whether the VMI is marked for evacuation from the node it runs on.
func (v *VirtualMachineInstance) MarkedForEvacuation() bool {
	return v.Status.NodeName != "" && v.Status.EvacuationNodeName == v.Status.NodeName
}

// EvacuationCause is the reason of the VMI's EvictionRequested condition, the cause of its mark
// (or of its last one); "" if none is recorded.
func (v *VirtualMachineInstance) EvacuationCause() string {
	if c := meta.FindStatusCondition(v.Status.Conditions, VMIConditionEvictionRequested); c != nil {
		return c.Reason
	}
	return ""
}

// LiveMigratable reports whether the running VMI can be live-migrated (its LiveMigratable
// condition), and if not, why: the condition's reason and message.
func (v *VirtualMachineInstance) LiveMigratable() (bool, string) {
	if v.Status.Phase != VMIRunning {
		return false, "the VM is " + phaseOrPending(v.Status.Phase) + ", not Running"
	}
	c := meta.FindStatusCondition(v.Status.Conditions, VMIConditionLiveMigratable)
	switch {
	case c == nil:
		return false, "its agent has not reported whether it can be live-migrated"
	case c.Status != metav1.ConditionTrue && c.Message != "":
		return false, c.Reason + ": " + c.Message
	case c.Status != metav1.ConditionTrue:
		return false, c.Reason
	}
	return true, ""
}

func phaseOrPending(p VirtualMachineInstancePhase) string {
	if p == "" {
		return string(VMIPending)
	}
	return string(p)
}

// MarkForEvacuation marks the VMI for evacuation from the node it runs on, the one mark every path
// (node pressure, the eviction webhook, EvictionRequests) sets: evacuationNodeName = nodeName and
// condition EvictionRequested=True whose reason is the cause. It reports whether the mark is new.
func MarkForEvacuation(status *VirtualMachineInstanceStatus, cause MigrationCause, message string, now metav1.Time) bool {
	isNew := status.EvacuationNodeName != status.NodeName
	status.EvacuationNodeName = status.NodeName
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: VMIConditionEvictionRequested, Status: metav1.ConditionTrue, Reason: string(cause), Message: message, LastTransitionTime: now,
	})
	return isNew
}

// ClearEvacuationMark removes the mark and its deadline; EvictionRequested turns False with reason
// and message if it was True. It reports whether there was a mark to clear.
func ClearEvacuationMark(status *VirtualMachineInstanceStatus, reason, message string, now metav1.Time) bool {
	wasMarked := status.EvacuationNodeName != ""
	status.EvacuationNodeName = ""
	status.EvacuationDeadline = nil
	if c := meta.FindStatusCondition(status.Conditions, VMIConditionEvictionRequested); c != nil && c.Status == metav1.ConditionTrue {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: VMIConditionEvictionRequested, Status: metav1.ConditionFalse, Reason: reason, Message: message, LastTransitionTime: now,
		})
		wasMarked = true
	}
	return wasMarked
}
