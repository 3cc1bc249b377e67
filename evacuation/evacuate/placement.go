package evacuate

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// Event reasons of the placement check on VMIs.
const (
	// ReasonNoTargetNode: no node other than the VM's own could take it; it cannot live-migrate.
	ReasonNoTargetNode = v1alpha1.VMIReasonNoTargetNode
	// ReasonTargetNodeAvailable: a node could take it again.
	ReasonTargetNodeAvailable = "TargetNodeAvailable"
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

// noTarget is check.NoTargetNode for v, remembered by what decides it.
func (p *Placer) noTarget(v *v1alpha1.VirtualMachineInstance) string {
	pod := vmi.TargetPlacement(v)
	key := fmt.Sprintf("%s|%s|%s", v.Status.NodeName, labels.Set(pod.Spec.NodeSelector).String(), pod.Spec.Containers[0].Resources.Requests.Memory().String())
	why, ok := p.found[key]
	if !ok {
		_, why = check.TargetNodes(pod, v.Status.NodeName, p.nodes)
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

// place sets each running VMI's NoTargetNode as the nodes stand, and returns vmis with the VMIs
// it wrote replaced by what the API server returned, so that the plan made next sees them.
func (c *Controller) place(ctx context.Context, vmis []*v1alpha1.VirtualMachineInstance) ([]*v1alpha1.VirtualMachineInstance, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return vmis, err
	}
	p := NewPlacer(nodes)
	now := metav1.NewTime(c.now())
	out := slices.Clone(vmis)
	var errs []error
	for i, v := range vmis {
		want := p.Condition(v, now)
		if want == nil {
			continue
		}
		local := v.DeepCopy()
		meta.SetStatusCondition(&local.Status.Conditions, *want)
		// The plan goes by what the nodes show now, written or not.
		out[i] = local
		updated, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).UpdateStatus(ctx, local, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // the VMI's change brings the controller back
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("setting %s/%s's LiveMigratable condition: %w", v.Namespace, v.Name, err))
			continue
		}
		out[i] = updated
		if want.Status == metav1.ConditionFalse {
			c.recorder.Event(updated, corev1.EventTypeWarning, ReasonNoTargetNode, want.Message+"; it cannot live-migrate until a node can take it")
			c.log.Info("no node can take VM", "vmi", v.Namespace+"/"+v.Name, "node", v.Status.NodeName, "why", want.Message)
		} else {
			c.recorder.Eventf(updated, corev1.EventTypeNormal, ReasonTargetNodeAvailable, "a node other than %s can take the VM again: it can live-migrate", v.Status.NodeName)
			c.log.Info("a node can take VM again", "vmi", v.Namespace+"/"+v.Name, "node", v.Status.NodeName)
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%d VMI(s): %w", len(errs), errs[0])
	}
	return out, nil
}
