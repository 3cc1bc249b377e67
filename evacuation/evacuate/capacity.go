package evacuate

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// NodeMayTakeMore reports whether a node's change could let the scheduler place a pod it could
// not place before: it became schedulable or ready, its labels or taints changed, or its
// allocatable resources did. Heartbeats and image lists change nothing.
func NodeMayTakeMore(old, cur *corev1.Node) bool {
	return old.Spec.Unschedulable != cur.Spec.Unschedulable ||
		!apiequality.Semantic.DeepEqual(old.Spec.Taints, cur.Spec.Taints) ||
		!maps.Equal(old.Labels, cur.Labels) ||
		!apiequality.Semantic.DeepEqual(old.Status.Allocatable, cur.Status.Allocatable) ||
		ready(old) != ready(cur)
}

func ready(n *corev1.Node) corev1.ConditionStatus {
	i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady })
	if i < 0 {
		return corev1.ConditionUnknown
	}
	return n.Status.Conditions[i].Status
}

// PodFreedCapacity reports whether a pod's update gave its node's resources back: a pod that
// reached a terminal phase no longer counts against its node. node is the pod's node, nil if it
// is gone; a pod on a node that is gone, not ready or cordoned frees nothing a target could use.
func PodFreedCapacity(old, cur *corev1.Pod, node *corev1.Node) bool {
	return usable(node) && !vmi.PodEnded(old) && vmi.PodEnded(cur)
}

// DeletionFreedCapacity reports whether deleting a pod gave its node's resources back: not if it
// had ended already (an ended pod no longer counted against its node), nor if its node is gone,
// not ready or cordoned (the pods of a removed node are collected long after it went).
func DeletionFreedCapacity(pod *corev1.Pod, node *corev1.Node) bool {
	return usable(node) && !vmi.PodEnded(pod)
}

// usable: a node the scheduler could place a pod on.
func usable(n *corev1.Node) bool {
	return n != nil && !n.Spec.Unschedulable && ready(n) == corev1.ConditionTrue
}

// NewCapacityInformers watches what can make room for a target pod: the nodes, and the pods bound
// to them. Both are cut down to the fields that tell (a pod keeps its name, node and phase), so
// watching every pod of a large cluster costs little memory.
func NewCapacityInformers(kube kubernetes.Interface) (nodes, pods cache.SharedIndexInformer) {
	nodes = coreinformers.NewNodeInformer(kube, 0, cache.Indexers{})
	_ = nodes.SetTransform(func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			n.ManagedFields, n.Status.Images = nil, nil
		}
		return obj, nil
	})
	pods = coreinformers.NewFilteredPodInformer(kube, metav1.NamespaceAll, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
	})
	_ = pods.SetTransform(func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
			Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName},
			Status:     corev1.PodStatus{Phase: p.Status.Phase},
		}, nil
	})
	return nodes, pods
}
