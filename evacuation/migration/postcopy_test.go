package migration

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestPostCopyTarget(t *testing.T) {
	node := func(name string, userfaultfd int64, change ...func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelKVMNode: "true"}},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}}}
		if userfaultfd >= 0 {
			n.Status.Allocatable[v1alpha1.DeviceUserFaultFD] = *resource.NewQuantity(userfaultfd, resource.DecimalSI)
		}
		for _, c := range change {
			c(n)
		}
		return n
	}
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	relieving := func(n *corev1.Node) { n.Labels[v1alpha1.LabelMemoryPressureRelief] = "true" }
	notLifeboat := func(n *corev1.Node) { delete(n.Labels, v1alpha1.LabelKVMNode) }
	for _, tc := range []struct {
		name    string
		allowed bool
		nodes   []*corev1.Node
		want    bool
	}{
		{"every other node offers one", true, []*corev1.Node{node("src", -1), node("a", 110), node("b", 110)}, true},
		{"post-copy not allowed for the VM", false, []*corev1.Node{node("src", 110), node("a", 110)}, false},
		{"one candidate lacks it: the target would be confined to the others", true, []*corev1.Node{node("src", 110), node("a", 110), node("b", -1)}, false},
		{"a node that advertises none left", true, []*corev1.Node{node("src", 110), node("a", 0)}, false},
		{"the source alone offers one", true, []*corev1.Node{node("src", 110), node("a", -1)}, false},
		{"no candidate at all", true, []*corev1.Node{node("src", 110)}, false},
		{"cordoned, relieving and non-lifeboat nodes are no candidates", true,
			[]*corev1.Node{node("src", -1), node("a", 110), node("b", -1, cordoned), node("c", -1, relieving), node("d", -1, notLifeboat)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PostCopyTarget(tc.allowed, tc.nodes, "src"); got != tc.want {
				t.Errorf("PostCopyTarget = %v, want %v", got, tc.want)
			}
		})
	}
}
