package vmi

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

var lostAt = metav1.NewTime(time.Date(2026, 11, 28, 12, 1, 5, 0, time.UTC))

type nodeOpt func(*corev1.Node)

func node(name string, opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
	for _, o := range opts {
		o(n)
	}
	return n
}

func notReady(s corev1.ConditionStatus, msg string) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s, Reason: "NodeStatusUnknown", Message: msg, LastTransitionTime: lostAt}}
	}
}

func noConditions(n *corev1.Node) { n.Status.Conditions = nil }

func tainted(key string) nodeOpt {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute, TimeAdded: &lostAt})
	}
}

func deleting(p *corev1.Pod) { p.DeletionTimestamp = &lostAt }

// readyNodes has every node Ready.
func readyNodes(name string) *corev1.Node { return node(name) }

func nodesAre(nodes ...*corev1.Node) NodeGetter {
	return func(name string) *corev1.Node {
		for _, n := range nodes {
			if n.Name == name {
				return n
			}
		}
		return nil
	}
}

func TestDecideNodeLoss(t *testing.T) {
	const unknown = "Kubelet stopped posting node status."
	lost := node("node-2", notReady(corev1.ConditionUnknown, unknown))
	running := pod(onNode("node-2"), inPhase(corev1.PodRunning))
	for _, tc := range []struct {
		name        string
		in          NodeLossInput
		want        NodeLossVerdict
		wantReason  string
		wantMessage []string // parts of the message
	}{
		{name: "a Ready node answers", in: NodeLossInput{NodeName: "node-2", Node: node("node-2"), Pod: running}, want: NodeAnswers},
		{name: "a Ready node whose pod was deleted still answers: its kubelet stops the pod", in: NodeLossInput{NodeName: "node-2", Node: node("node-2")}, want: NodeAnswers},
		{name: "a deleted Node took its guests", in: NodeLossInput{NodeName: "node-2"},
			want: GuestGone, wantReason: ReasonNodeDeleted, wantMessage: []string{"node node-2 was deleted"}},
		{name: "a deleted Node whose pod pod GC marked Failed", in: NodeLossInput{NodeName: "node-2", Pod: pod(onNode("node-2"), inPhase(corev1.PodFailed))},
			want: GuestGone, wantReason: ReasonNodeDeleted},
		{name: "a pod bound to a Node that does not exist (yet, or any more): wait for pod GC", in: NodeLossInput{NodeName: "node-2", Pod: running},
			want: WaitForNode, wantReason: ReasonWaitingForNode, wantMessage: []string{"node node-2 does not exist", "pod garbage collector"}},
		{name: "NotReady (Unknown): wait, saying since when and what to do", in: NodeLossInput{NodeName: "node-2", Node: lost, Pod: running},
			want: WaitForNode, wantReason: ReasonWaitingForNode, wantMessage: []string{
				"node node-2 is NotReady (Unknown) since 2026-11-28T12:01:05Z (" + unknown + ")", "the VM may still run there",
				"kubectl taint node node-2 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute", "or delete the Node"}},
		{name: "NotReady (False) waits too", in: NodeLossInput{NodeName: "node-2", Node: node("node-2", notReady(corev1.ConditionFalse, "container runtime is down")), Pod: running},
			want: WaitForNode, wantReason: ReasonWaitingForNode, wantMessage: []string{"is NotReady since", "container runtime is down"}},
		{name: "a node that never reported Ready waits", in: NodeLossInput{NodeName: "node-2", Node: node("node-2", noConditions), Pod: running},
			want: WaitForNode, wantReason: ReasonWaitingForNode, wantMessage: []string{"has not reported Ready"}},
		{name: "the taint manager's deletion, never carried out, is no evidence", in: NodeLossInput{NodeName: "node-2", Node: lost, Pod: pod(onNode("node-2"), inPhase(corev1.PodRunning), deleting)},
			want: WaitForNode, wantReason: ReasonWaitingForNode, wantMessage: []string{"is being deleted, which the node's kubelet has not carried out"}},
		{name: "a force-deleted pod on a NotReady node is no evidence", in: NodeLossInput{NodeName: "node-2", Node: lost},
			want: WaitForNode, wantReason: ReasonWaitingForNode, wantMessage: []string{"deleted through the API, which stops nothing"}},
		{name: "out-of-service: the admin says the node is off", in: NodeLossInput{NodeName: "node-2", Node: node("node-2", notReady(corev1.ConditionUnknown, unknown), tainted(corev1.TaintNodeOutOfService)), Pod: running},
			want: GuestGone, wantReason: ReasonNodeOutOfService, wantMessage: []string{"tainted node.kubernetes.io/out-of-service since 2026-11-28T12:01:05Z"}},
		{name: "out-of-service with the pod force-deleted (pod GC)", in: NodeLossInput{NodeName: "node-2", Node: node("node-2", notReady(corev1.ConditionUnknown, unknown), tainted(corev1.TaintNodeOutOfService))},
			want: GuestGone, wantReason: ReasonNodeOutOfService},
		{name: "other NoExecute taints (unreachable) are no evidence", in: NodeLossInput{NodeName: "node-2", Node: node("node-2", notReady(corev1.ConditionUnknown, unknown), tainted(corev1.TaintNodeUnreachable)), Pod: running},
			want: WaitForNode, wantReason: ReasonWaitingForNode},
		{name: "a pod that ended (kubelet, or pod GC) is evidence", in: NodeLossInput{NodeName: "node-2", Node: lost, Pod: pod(onNode("node-2"), inPhase(corev1.PodFailed))},
			want: GuestGone, wantReason: ReasonLauncherPodEnded},
		{name: "the agent reported the guest not running before the node fell silent", in: NodeLossInput{NodeName: "node-2", Node: lost, Pod: running, AgentReportedGuestGone: true},
			want: GuestGone, wantReason: ReasonAgentReportedGuestGone},
		{name: "on a Ready node the agent's report is the agent's to act on", in: NodeLossInput{NodeName: "node-2", Node: node("node-2"), Pod: running, AgentReportedGuestGone: true},
			want: NodeAnswers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideNodeLoss(tc.in)
			if got.Verdict != tc.want || got.Reason != tc.wantReason {
				t.Errorf("DecideNodeLoss() = %v (%s): %s; want %v (%s)", got.Verdict, got.Reason, got.Message, tc.want, tc.wantReason)
			}
			for _, part := range tc.wantMessage {
				if !strings.Contains(got.Message, part) {
					t.Errorf("message %q lacks %q", got.Message, part)
				}
			}
		})
	}
}

func runningOn(n string) *v1alpha1.VirtualMachineInstance {
	v := vmiIn(v1alpha1.VMIRunning)
	v.Status.NodeName = n
	v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionReady, Status: metav1.ConditionTrue, Reason: "GuestRunning"}}
	return v
}

// NextStatus keeps a VMI on a lost node non-terminal with the NodeLost condition, fails it
// once the node is known to be off, and clears the condition when the node answers again.
func TestNextStatusOnALostNode(t *testing.T) {
	now := metav1.NewTime(lostAt.Add(time.Minute))
	lost := node("node-2", notReady(corev1.ConditionUnknown, "Kubelet stopped posting node status."))
	off := node("node-2", notReady(corev1.ConditionUnknown, "Kubelet stopped posting node status."), tainted(corev1.TaintNodeOutOfService))
	waiting := func() *v1alpha1.VirtualMachineInstance {
		v := runningOn("node-2")
		waitForNode(&v.Status, DecideNodeLoss(NodeLossInput{NodeName: "node-2", Node: lost, Pod: pod(onNode("node-2"))}), now)
		return v
	}
	for _, tc := range []struct {
		name         string
		vmi          *v1alpha1.VirtualMachineInstance
		pod          *corev1.Pod
		nodes        NodeGetter
		wantPhase    v1alpha1.VirtualMachineInstancePhase
		wantReason   string
		wantNodeLost metav1.ConditionStatus // "" for no condition
		wantEvent    string
	}{
		{name: "running pod on a NotReady node: wait", vmi: runningOn("node-2"), pod: pod(onNode("node-2"), inPhase(corev1.PodRunning)), nodes: nodesAre(lost),
			wantPhase: v1alpha1.VMIRunning, wantNodeLost: metav1.ConditionTrue, wantEvent: ReasonNodeLost},
		{name: "pod force-deleted on a NotReady node: still wait, not LauncherPodVanished", vmi: runningOn("node-2"), nodes: nodesAre(lost),
			wantPhase: v1alpha1.VMIRunning, wantNodeLost: metav1.ConditionTrue, wantEvent: ReasonNodeLost},
		{name: "still waiting: no second Event", vmi: waiting(), pod: pod(onNode("node-2")), nodes: nodesAre(lost),
			wantPhase: v1alpha1.VMIRunning, wantNodeLost: metav1.ConditionTrue},
		{name: "the taint manager deletes the pod: the message says so, in an Event", vmi: waiting(), pod: pod(onNode("node-2"), inPhase(corev1.PodRunning), deleting), nodes: nodesAre(lost),
			wantPhase: v1alpha1.VMIRunning, wantNodeLost: metav1.ConditionTrue, wantEvent: ReasonNodeLost},
		{name: "out-of-service taint: Failed, the wait ended", vmi: waiting(), pod: pod(onNode("node-2"), inPhase(corev1.PodRunning), deleting), nodes: nodesAre(off),
			wantPhase: v1alpha1.VMIFailed, wantReason: ReasonNodeOutOfService, wantNodeLost: metav1.ConditionFalse, wantEvent: ReasonNodeOutOfService},
		{name: "out-of-service taint, the pod gone (pod GC): Failed", vmi: waiting(), nodes: nodesAre(off),
			wantPhase: v1alpha1.VMIFailed, wantReason: ReasonNodeOutOfService, wantNodeLost: metav1.ConditionFalse, wantEvent: ReasonNodeOutOfService},
		{name: "the Node deleted: Failed", vmi: waiting(), nodes: nodesAre(),
			wantPhase: v1alpha1.VMIFailed, wantReason: ReasonNodeDeleted, wantNodeLost: metav1.ConditionFalse, wantEvent: ReasonNodeDeleted},
		{name: "the node answers again: the condition goes", vmi: waiting(), pod: pod(onNode("node-2"), inPhase(corev1.PodRunning)), nodes: readyNodes,
			wantPhase: v1alpha1.VMIRunning, wantEvent: ReasonNodeAnswers},
		{name: "a scheduled guest on a node that went NotReady waits too", vmi: vmiIn(v1alpha1.VMIScheduling), pod: pod(onNode("node-2")), nodes: nodesAre(lost),
			wantPhase: v1alpha1.VMIScheduled, wantNodeLost: metav1.ConditionTrue, wantEvent: ReasonNodeLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, events := NextStatus(tc.vmi, tc.pod, tc.nodes, now)
			if status.Phase != tc.wantPhase || status.Reason != tc.wantReason {
				t.Errorf("phase %s (%s: %s), want %s (%s)", status.Phase, status.Reason, status.Message, tc.wantPhase, tc.wantReason)
			}
			c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionNodeLost)
			switch {
			case tc.wantNodeLost == "" && c != nil:
				t.Errorf("want no NodeLost condition, got %+v", c)
			case tc.wantNodeLost != "" && (c == nil || c.Status != tc.wantNodeLost):
				t.Errorf("NodeLost condition %+v, want status %s", c, tc.wantNodeLost)
			}
			if c != nil && c.Status == metav1.ConditionTrue && !strings.Contains(c.Message, "node.kubernetes.io/out-of-service") {
				t.Errorf("the NodeLost message says what to do: %q", c.Message)
			}
			var reasons []string
			for _, e := range events {
				reasons = append(reasons, e.Reason)
			}
			if tc.wantEvent == "" {
				if len(events) != 0 {
					t.Errorf("events %v, want none", reasons)
				}
				return
			}
			if !strings.Contains(strings.Join(reasons, ","), tc.wantEvent) {
				t.Errorf("events %v, want %s", reasons, tc.wantEvent)
			}
		})
	}
}
