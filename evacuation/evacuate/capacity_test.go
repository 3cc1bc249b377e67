package evacuate

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeMayTakeMore(t *testing.T) {
	base := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"zone": "a"}, ResourceVersion: "1"},
			Status: corev1.NodeStatus{
				Allocatable: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")},
				Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Unix(1, 0)}},
			},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.Node)
		want   bool
	}{
		{"a heartbeat", func(n *corev1.Node) {
			n.Status.Conditions[0].LastHeartbeatTime = metav1.Unix(2, 0)
			n.ResourceVersion = "2"
		}, false},
		{"new images", func(n *corev1.Node) { n.Status.Images = []corev1.ContainerImage{{Names: []string{"x"}}} }, false},
		{"a label (a node selector may match now)", func(n *corev1.Node) { n.Labels["pinned"] = "yes" }, true},
		{"cordoned or uncordoned", func(n *corev1.Node) { n.Spec.Unschedulable = true }, true},
		{"a taint removed or added", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}} }, true},
		{"more memory", func(n *corev1.Node) { n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("16Gi") }, true},
		{"became ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := base(), base()
			tc.change(cur)
			if got := NodeMayTakeMore(old, cur); got != tc.want {
				t.Errorf("NodeMayTakeMore = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPodFreedCapacity(t *testing.T) {
	pod := func(node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	ready := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	notReady := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}}}
	cordoned := ready.DeepCopy()
	cordoned.Spec.Unschedulable = true
	for _, tc := range []struct {
		name     string
		old, cur *corev1.Pod
		node     *corev1.Node
		want     bool
	}{
		{"a pod ends on a ready node", pod("n", corev1.PodRunning), pod("n", corev1.PodSucceeded), ready, true},
		{"a pod fails on a ready node", pod("n", corev1.PodPending), pod("n", corev1.PodFailed), ready, true},
		{"a pod starts", pod("n", corev1.PodPending), pod("n", corev1.PodRunning), ready, false},
		{"an ended pod changes again", pod("n", corev1.PodFailed), pod("n", corev1.PodFailed), ready, false},
		{"a pod ends on a node that is gone", pod("n", corev1.PodRunning), pod("n", corev1.PodFailed), nil, false},
		{"a pod ends on a node that is not ready", pod("n", corev1.PodRunning), pod("n", corev1.PodFailed), notReady, false},
		{"a pod ends on a cordoned node", pod("n", corev1.PodRunning), pod("n", corev1.PodFailed), cordoned, false},
	} {
		if got := PodFreedCapacity(tc.old, tc.cur, tc.node); got != tc.want {
			t.Errorf("%s: PodFreedCapacity = %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		node *corev1.Node
		want bool
	}{
		{"a running pod deleted", pod("n", corev1.PodRunning), ready, true},
		{"a pod that had ended deleted", pod("n", corev1.PodSucceeded), ready, false},
		{"a pod of a node that is gone deleted (the pod collector, long after)", pod("n", corev1.PodRunning), nil, false},
	} {
		if got := DeletionFreedCapacity(tc.pod, tc.node); got != tc.want {
			t.Errorf("%s: DeletionFreedCapacity = %v, want %v", tc.name, got, tc.want)
		}
	}
}
