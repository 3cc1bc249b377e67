// Package disruption keeps what the cluster's disruption machinery sees of each VM: a
// PodDisruptionBudget over its launcher pods per seed 000's third table, expanded to cover a
// migration's target pod while it exists, and the descheduler's eviction-in-progress annotation on
// the source pod of a VM marked for evacuation (seed 003).
package disruption

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// MinAvailable is how many of the VMI's launcher pods its budget keeps; 0 means it needs no budget.
// pods are the VMI's launcher pods (the source and, during a migration, the target); migrating
// says the VMI has a migration that has not ended, whose target pod the budget must cover from
// before it exists (seed 000: the budget is expanded before the target pod is created).
func MinAvailable(vmi *v1alpha1.VirtualMachineInstance, config *v1alpha1.LifeboatConfig, pods []*corev1.Pod, migrating bool) int32 {
	if vmi.Status.Phase.Terminal() || vmi.DeletionTimestamp != nil {
		return 0
	}
	switch v1alpha1.EffectiveEvictionStrategy(vmi, config) {
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyExternal:
	case v1alpha1.EvictionStrategyLiveMigrateIfPossible:
		// Only while migratable: a VM that cannot move (its agent's reason, or NoTargetNode: no
		// other node can take it) must not block a drain forever.
		if ok, _ := vmi.LiveMigratable(); !ok {
			return 0
		}
	default:
		return 0
	}
	// Every pod that has not ended counts: during a migration the target pod is protected as well.
	var live int32
	for _, p := range pods {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live++
		}
	}
	if migrating {
		live = max(live, 2)
	}
	return min(max(live, 1), 2)
}

// EvictionInProgress reports whether pod, one of the VMI's launcher pods, should carry the
// descheduler's eviction-in-progress annotation: it is the source pod of a VM marked for
// evacuation. The mark outlives a failed attempt, and so does the annotation.
func EvictionInProgress(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) bool {
	return vmi.MarkedForEvacuation() && pod.Spec.NodeName == vmi.Status.NodeName
}
