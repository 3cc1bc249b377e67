package evacuate

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/placement"
)

// Event reasons of the placement check on VMIs.
const (
	// ReasonNoTargetNode: no node other than the VM's own could take it; it cannot live-migrate.
	ReasonNoTargetNode = v1alpha1.VMIReasonNoTargetNode
	// ReasonTargetNodeAvailable: a node could take it again.
	ReasonTargetNodeAvailable = "TargetNodeAvailable"
)

// place sets each running VMI's NoTargetNode as the nodes stand, and returns vmis with the VMIs
// it wrote replaced by what the API server returned, so that the plan made next sees them.
func (c *Controller) place(ctx context.Context, vmis []*v1alpha1.VirtualMachineInstance) ([]*v1alpha1.VirtualMachineInstance, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return vmis, err
	}
	p := placement.NewPlacer(nodes)
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
