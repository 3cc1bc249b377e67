package placement

import (
	"cmp"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipkg "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// Placer decides the LiveMigratable condition's NoTargetNode from the nodes. It remembers, for
// one look at the cluster, what it found for each kind of target pod (source node, node
// selector, memory request), since many VMs share one.
type Placer struct {
	nodes []*corev1.Node
	found map[string]string
}

// NewPlacer looks at nodes, which it sorts by name so that its reasons read the same each time.
func NewPlacer(nodes []*corev1.Node) *Placer {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	return &Placer{nodes: nodes, found: map[string]string{}}
}

// noTarget is NoTargetNode for v, remembered by what decides it.
func (p *Placer) noTarget(v *v1alpha1.VirtualMachineInstance) string {
	pod := vmipkg.TargetPlacement(v)
	key := fmt.Sprintf("%s|%s|%s", v.Status.NodeName, labels.Set(pod.Spec.NodeSelector).String(), pod.Spec.Containers[0].Resources.Requests.Memory().String())
	why, ok := p.found[key]
	if !ok {
		_, why = TargetNodes(pod, v.Status.NodeName, p.nodes)
		p.found[key] = why
	}
	return why
}

// Condition is the LiveMigratable condition the evacuation controller sets on v, or nil to leave
// the condition as it is. The agent owns the condition for the domain's own reasons, so only a
// True condition turns False with reason NoTargetNode when no other node could take the VM's
// target pod, and only a NoTargetNode one turns True again when a node could. While a migration
// has its target running (the VMI records it) a node was found: the condition is not turned
// False under it, which would drop a LiveMigrateIfPossible VM's disruption budget mid-move.
func (p *Placer) Condition(v *v1alpha1.VirtualMachineInstance, now metav1.Time) *metav1.Condition {
	if v.Status.Phase != v1alpha1.VMIRunning || v.Status.NodeName == "" || v.DeletionTimestamp != nil {
		return nil
	}
	c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	if c == nil {
		return nil
	}
	noTarget := c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.VMIReasonNoTargetNode
	if c.Status != metav1.ConditionTrue && !noTarget {
		return nil
	}
	// Without its own node in view the nodes are not known (a cache not synced yet, or a test
	// without nodes): nothing is concluded from them.
	if !slices.ContainsFunc(p.nodes, func(n *corev1.Node) bool { return n.Name == v.Status.NodeName }) {
		return nil
	}
	why := p.noTarget(v)
	switch {
	case why == "" && noTarget:
		return &metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: v1alpha1.VMIReasonMigratable, LastTransitionTime: now}
	case why == "":
		return nil
	}
	msg := why
	switch {
	case noTarget && c.Message == msg:
		return nil
	case !noTarget && migrationUnderWay(v):
		return nil
	}
	return &metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: v1alpha1.VMIReasonNoTargetNode, Message: msg, LastTransitionTime: now}
}

// migrationUnderWay: the VMI records a migration that has not ended.
func migrationUnderWay(v *v1alpha1.VirtualMachineInstance) bool {
	s := v.Status.MigrationState
	return s != nil && !s.Completed && !s.Failed
}
