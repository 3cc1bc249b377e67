package vmi

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A node that stops answering is not a migration. Its guests may still run, writing their
// disks, while the API server hears nothing of them; a VM started elsewhere meanwhile is a
// second copy of one VM. So a VMI on such a node fails (and its VM's run strategy starts it
// elsewhere) only once the node is known to have stopped it:
//
//	what is known                                   verdict
//	the Node object is gone (deleted), and the pod  GuestGone (NodeDeleted); while the pod is there,
//	  gone or ended                                   WaitForNode: pod GC removes it soon
//	the launcher pod ended (Succeeded/Failed)       GuestGone (its kubelet, or pod GC on an out-of-service node, recorded it)
//	the node has node.kubernetes.io/out-of-service  GuestGone (NodeOutOfService: the admin says the node is off)
//	the node is Ready                               NodeAnswers (its kubelet and agent carry out what the API says)
//	its agent reported the guest not running        GuestGone (AgentReportedGuestGone)
//	anything else: NotReady, Unknown, no condition  WaitForNode (NodeLost=True), whatever happened to the pod
//
// A launcher pod deleted through the API, force-deleted included, or being deleted by the
// taint manager, is no evidence: only the node's kubelet stops its containers, and it does not
// answer.

// NodeLossVerdict is what the VMI controller may conclude about a guest on its node.
type NodeLossVerdict int

const (
	// NodeAnswers: the node is Ready; the launcher pod's phase says what became of the guest.
	NodeAnswers NodeLossVerdict = iota
	// GuestGone: the guest is known to run no longer; the VMI may fail and its VM start elsewhere.
	GuestGone
	// WaitForNode: the node does not answer and the guest may still run there; the VMI waits.
	WaitForNode
)

func (v NodeLossVerdict) String() string {
	switch v {
	case NodeAnswers:
		return "NodeAnswers"
	case GuestGone:
		return "GuestGone"
	case WaitForNode:
		return "WaitForNode"
	}
	return fmt.Sprintf("NodeLossVerdict(%d)", int(v))
}

// Reasons of the node-loss decision: the VMI's failure reason when the guest is gone, the
// NodeLost condition's reason while it waits.
const (
	ReasonNodeDeleted            = "NodeDeleted"
	ReasonNodeOutOfService       = "NodeOutOfService"
	ReasonLauncherPodEnded       = "LauncherPodEnded"
	ReasonAgentReportedGuestGone = "AgentReportedGuestGone"
	ReasonWaitingForNode         = "WaitingForNode"
	// ReasonNodeAnswers is the Event of a node that answers again while a VMI waited for it.
	ReasonNodeAnswers = "NodeAnswers"
)

// NodeLossInput is what the controller knows of the node a VMI's guest runs on.
type NodeLossInput struct {
	// NodeName is the node the guest runs on, or was started on.
	NodeName string
	// Node is that Node as the API server has it; nil when it does not exist (deleted).
	Node *corev1.Node
	// Pod is the VMI's launcher pod; nil when it is gone from the API server (deleted or
	// force-deleted: either way, nothing says its containers stopped).
	Pod *corev1.Pod
	// AgentReportedGuestGone: the node's agent last reported the guest's domain not running
	// (Ready=False, GuestNotRunning, on a Running VMI), before it too fell silent.
	AgentReportedGuestGone bool
}

// NodeLoss is the decision, with a reason and a message an admin acts on.
type NodeLoss struct {
	Verdict NodeLossVerdict
	Reason  string
	Message string
	// NodeReady is true when the node's Ready condition is True: its kubelet carries out
	// deletions, so the controller need not force any.
	NodeReady bool
}

// OutOfServiceTaintCommand is the command that tells Kubernetes (and lifeboat) a node is off.
func OutOfServiceTaintCommand(node string) string {
	return fmt.Sprintf("kubectl taint node %s %s=nodeshutdown:NoExecute", node, corev1.TaintNodeOutOfService)
}

// DecideNodeLoss says whether a guest on in.NodeName may be declared gone and its VM restarted
// elsewhere (the table above). It is pure: the same input gives the same answer.
func DecideNodeLoss(in NodeLossInput) NodeLoss {
	if in.Node == nil {
		if in.Pod == nil || PodEnded(in.Pod) {
			return NodeLoss{Verdict: GuestGone, Reason: ReasonNodeDeleted,
				Message: fmt.Sprintf("node %s was deleted, and its guests with it; the VM may start on another node", in.NodeName)}
		}
		// Kubernetes' pod GC removes the pods of a deleted node (after a short quarantine, in
		// case the Node object comes back, or was not seen yet).
		return NodeLoss{Verdict: WaitForNode, Reason: ReasonWaitingForNode,
			Message: fmt.Sprintf("node %s does not exist; once Kubernetes' pod garbage collector removes its launcher pod %s (within a minute or so of the Node's deletion), the VM may start on another node", in.NodeName, in.Pod.Name)}
	}
	ready := readyCondition(in.Node)
	isReady := ready != nil && ready.Status == corev1.ConditionTrue
	if in.Pod != nil && PodEnded(in.Pod) {
		return NodeLoss{Verdict: GuestGone, Reason: ReasonLauncherPodEnded, NodeReady: isReady,
			Message: fmt.Sprintf("launcher pod %s on node %s ended (%s)", in.Pod.Name, in.NodeName, in.Pod.Status.Phase)}
	}
	if t := outOfService(in.Node); t != nil {
		since := ""
		if t.TimeAdded != nil {
			since = " since " + t.TimeAdded.UTC().Format(time.RFC3339)
		}
		return NodeLoss{Verdict: GuestGone, Reason: ReasonNodeOutOfService, NodeReady: isReady,
			Message: fmt.Sprintf("node %s is tainted %s%s: it is known to be off, and the VM may start on another node", in.NodeName, corev1.TaintNodeOutOfService, since)}
	}
	if isReady {
		return NodeLoss{Verdict: NodeAnswers, NodeReady: true}
	}
	if in.AgentReportedGuestGone {
		return NodeLoss{Verdict: GuestGone, Reason: ReasonAgentReportedGuestGone,
			Message: fmt.Sprintf("node %s does not answer, but its agent reported the guest no longer running before that; the VM may start on another node", in.NodeName)}
	}
	return NodeLoss{Verdict: WaitForNode, Reason: ReasonWaitingForNode, Message: waitMessage(in, ready)}
}

func waitMessage(in NodeLossInput, ready *corev1.NodeCondition) string {
	state := "has not reported Ready"
	if ready != nil {
		state = "is NotReady"
		if ready.Status == corev1.ConditionUnknown {
			state = "is NotReady (Unknown)"
		}
		if !ready.LastTransitionTime.IsZero() {
			state += " since " + ready.LastTransitionTime.UTC().Format(time.RFC3339)
		}
		if ready.Message != "" {
			state += " (" + ready.Message + ")"
		}
	}
	pod := ""
	switch {
	case in.Pod == nil:
		pod = "; its launcher pod was deleted through the API, which stops nothing on a node that does not answer"
	case in.Pod.DeletionTimestamp != nil:
		pod = fmt.Sprintf("; its launcher pod %s is being deleted, which the node's kubelet has not carried out", in.Pod.Name)
	}
	return fmt.Sprintf("node %s %s%s; the VM may still run there, so it is not started elsewhere. "+
		"Once the node is known to be off, taint it: %s, or delete the Node",
		in.NodeName, state, pod, OutOfServiceTaintCommand(in.NodeName))
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func outOfService(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == corev1.TaintNodeOutOfService {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// agentReportedGuestGone reads the node agent's last report from the VMI: a Running VMI whose
// Ready condition the agent set False because the guest's domain no longer runs.
func agentReportedGuestGone(status *v1alpha1.VirtualMachineInstanceStatus) bool {
	if status.Phase != v1alpha1.VMIRunning {
		return false
	}
	c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionReady)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.VMIReasonGuestNotRunning
}
