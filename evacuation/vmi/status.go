package vmi

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Event is what the sync should record on the VMI after a status change.
type Event struct {
	Type, Reason, Message string
}

// Reasons of VMI events and status, CamelCase as Kubernetes has them.
const (
	ReasonSuccessfulCreate = "SuccessfulCreate"
	ReasonFailedCreate     = "FailedCreate"
	ReasonScheduled        = "Scheduled"
	ReasonFailedScheduling = "FailedScheduling"
	ReasonStopped          = "Stopped"
	ReasonLauncherFailed   = "LauncherFailed"
	// ReasonNodePathRefused: the VMI names a node path the cluster admin does not allow; it gets no pod.
	ReasonNodePathRefused  = "NodePathRefused"
	ReasonLauncherVanished = "LauncherPodVanished"
	ReasonShuttingDown     = "ShuttingDown"
	ReasonGuestShutDown    = "GuestShutDown"
	// ReasonNodeLost is the Event of a VMI that waits for its node (condition NodeLost).
	ReasonNodeLost = "NodeLost"
	// ReasonForceDeleted: the launcher pod of a deleted VMI on a node known to be off was
	// removed from the API server, as no kubelet would.
	ReasonForceDeleted      = "ForceDeletedLauncherPod"
	conditionMessageUnknown = "the launcher pod ended"
)

var phaseOrder = map[v1alpha1.VirtualMachineInstancePhase]int{
	"": 0, v1alpha1.VMIPending: 1, v1alpha1.VMIScheduling: 2, v1alpha1.VMIScheduled: 3, v1alpha1.VMIRunning: 4,
	v1alpha1.VMISucceeded: 5, v1alpha1.VMIFailed: 5,
}

// NodeGetter finds a Node by name: nil when there is none.
type NodeGetter func(name string) *corev1.Node

// NextStatus is the VMI status the launcher pod implies, and the events to record for the change.
// pod is nil when the VMI has no launcher pod; the first pod is recorded as its launcher. Phases only move forward; Running and the
// conditions on a running guest are the agent's to set. nodes finds the node the guest runs on:
// while it does not answer, the VMI waits (NodeLost) until DecideNodeLoss says the guest is gone.
func NextStatus(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, nodes NodeGetter, now metav1.Time) (v1alpha1.VirtualMachineInstanceStatus, []Event) {
	status := *vmi.Status.DeepCopy()
	if status.Phase.Terminal() {
		return status, nil
	}
	if status.LauncherPod == nil && pod != nil {
		// The node's agent binds the VM to the pod recorded here, where only lifeboat writes,
		// and to no other pod however it is labelled. A completed migration moves the record to
		// its target pod; nothing else replaces it.
		status.LauncherPod = &v1alpha1.LauncherPodRef{Name: pod.Name, UID: pod.UID}
	}
	advance := func(p v1alpha1.VirtualMachineInstancePhase) bool {
		if phaseOrder[p] > phaseOrder[status.Phase] {
			status.Phase = p
			return true
		}
		return false
	}

	if pod == nil {
		if phaseOrder[status.Phase] <= phaseOrder[v1alpha1.VMIScheduling] {
			advance(v1alpha1.VMIPending)
			return status, nil
		}
		if s := status.MigrationState; s != nil && !s.Completed && !s.Failed && s.SourceNode == status.NodeName {
			// The source pod of a running migration went: deleted through the API (a drain, a
			// pod deletion), it is removed once its launcher exits, which it does as soon as its
			// guest has left. The migration's outcome, which its source agent records, says
			// where the VM is.
			return status, nil
		}
		msg := "the launcher pod was deleted while the guest was " + string(status.Phase)
		if status.NodeName == "" {
			fail(&status, ReasonLauncherVanished, msg, now)
			return status, []Event{{corev1.EventTypeWarning, ReasonLauncherVanished, msg}}
		}
		// A pod deleted through the API, even force-deleted, is gone from the API only: on a
		// node that does not answer its guest may run on.
		loss := DecideNodeLoss(NodeLossInput{NodeName: status.NodeName, Node: nodes(status.NodeName), AgentReportedGuestGone: agentReportedGuestGone(&status)})
		switch loss.Verdict {
		case WaitForNode:
			return status, waitForNode(&status, loss, now)
		case GuestGone:
			msg += ": " + loss.Message
			fail(&status, loss.Reason, msg, now)
			nodeLostEnded(&status, loss, now)
			return status, []Event{{corev1.EventTypeWarning, loss.Reason, msg}}
		}
		fail(&status, ReasonLauncherVanished, msg, now)
		return status, append(nodeAnswers(&status, status.NodeName), Event{corev1.EventTypeWarning, ReasonLauncherVanished, msg})
	}

	var events []Event
	if s := status.MigrationState; s != nil && !s.Completed && !s.Failed && s.SourceNode == pod.Spec.NodeName &&
		PodEnded(pod) {
		// The source launcher ends when its guest has left; the migration's outcome, not this
		// pod, says where the VM is.
		return status, nil
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		status.Phase = v1alpha1.VMISucceeded
		status.Reason, status.Message = ReasonGuestShutDown, "the guest shut down and its launcher exited"
		setReady(&status, metav1.ConditionFalse, ReasonGuestShutDown, status.Message, now)
		return status, []Event{{corev1.EventTypeNormal, ReasonStopped, status.Message}}
	case corev1.PodFailed:
		msg := PodFailureMessage(pod)
		fail(&status, ReasonLauncherFailed, msg, now)
		return status, []Event{{corev1.EventTypeWarning, ReasonLauncherFailed, msg}}
	}

	if pod.Spec.NodeName == "" {
		advance(v1alpha1.VMIScheduling)
		if c := podCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			events = append(events, Event{corev1.EventTypeWarning, ReasonFailedScheduling,
				fmt.Sprintf("launcher pod %s cannot be scheduled: %s", pod.Name, c.Message)})
		}
		return status, events
	}
	if advance(v1alpha1.VMIScheduled) {
		status.NodeName = pod.Spec.NodeName
		events = append(events, Event{corev1.EventTypeNormal, ReasonScheduled,
			fmt.Sprintf("launcher pod %s scheduled to node %s", pod.Name, pod.Spec.NodeName)})
	}
	if pod.Spec.NodeName != status.NodeName {
		// A migration's pod on another node: the guest's node is what counts, and this pod
		// says nothing of it.
		return status, events
	}
	loss := DecideNodeLoss(NodeLossInput{NodeName: pod.Spec.NodeName, Node: nodes(pod.Spec.NodeName), Pod: pod,
		AgentReportedGuestGone: agentReportedGuestGone(&status)})
	switch loss.Verdict {
	case WaitForNode:
		return status, append(events, waitForNode(&status, loss, now)...)
	case GuestGone:
		fail(&status, loss.Reason, loss.Message, now)
		nodeLostEnded(&status, loss, now)
		return status, append(events, Event{corev1.EventTypeWarning, loss.Reason, loss.Message})
	}
	return status, append(events, nodeAnswers(&status, pod.Spec.NodeName)...)
}

// waitForNode keeps the VMI as it is, with the NodeLost condition saying why; an Event when
// that is news.
func waitForNode(status *v1alpha1.VirtualMachineInstanceStatus, loss NodeLoss, now metav1.Time) []Event {
	if old := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionNodeLost); old != nil &&
		old.Status == metav1.ConditionTrue && old.Message == loss.Message {
		return nil
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: v1alpha1.VMIConditionNodeLost, Status: metav1.ConditionTrue, Reason: loss.Reason, Message: loss.Message, LastTransitionTime: now,
	})
	return []Event{{corev1.EventTypeWarning, ReasonNodeLost, loss.Message}}
}

// nodeLostEnded sets a NodeLost condition the VMI has False: the wait ended, for loss's reason.
func nodeLostEnded(status *v1alpha1.VirtualMachineInstanceStatus, loss NodeLoss, now metav1.Time) {
	if meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionNodeLost) != nil {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: v1alpha1.VMIConditionNodeLost, Status: metav1.ConditionFalse, Reason: loss.Reason, Message: loss.Message, LastTransitionTime: now,
		})
	}
}

// nodeAnswers clears the NodeLost condition of a VMI whose node answers again.
func nodeAnswers(status *v1alpha1.VirtualMachineInstanceStatus, node string) []Event {
	if !meta.RemoveStatusCondition(&status.Conditions, v1alpha1.VMIConditionNodeLost) {
		return nil
	}
	return []Event{{corev1.EventTypeNormal, ReasonNodeAnswers, "node " + node + " answers again"}}
}

func fail(status *v1alpha1.VirtualMachineInstanceStatus, reason, msg string, now metav1.Time) {
	status.Phase = v1alpha1.VMIFailed
	status.Reason, status.Message = reason, msg
	setReady(status, metav1.ConditionFalse, reason, msg, now)
}

func setReady(status *v1alpha1.VirtualMachineInstanceStatus, s metav1.ConditionStatus, reason, msg string, now metav1.Time) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: v1alpha1.VMIConditionReady, Status: s, Reason: reason, Message: msg, LastTransitionTime: now,
	})
}

// PodFailureMessage says how a failed launcher pod ended, from what the kubelet recorded.
func PodFailureMessage(pod *corev1.Pod) string {
	msg := ""
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != launcher.ContainerName || cs.State.Terminated == nil {
			continue
		}
		t := cs.State.Terminated
		msg = fmt.Sprintf("launcher container exited with code %d", t.ExitCode)
		if t.Signal != 0 {
			msg += fmt.Sprintf(" (signal %d)", t.Signal)
		}
		if t.Reason != "" {
			msg += ", reason " + t.Reason
		}
		if t.Message != "" {
			msg += ": " + t.Message
		}
	}
	if pod.Status.Reason != "" {
		if msg != "" {
			msg = "; " + msg
		}
		msg = fmt.Sprintf("launcher pod %s: %s", pod.Status.Reason, pod.Status.Message) + msg
	}
	if msg == "" {
		msg = conditionMessageUnknown
	}
	return msg
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
