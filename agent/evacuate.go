package agent

import (
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// ShouldEvacuateVMI is seed 001's shouldEvacuateVMI, behind the NodePressureEvictionLiveMigration
// gate: a running VMI, not being deleted, whose launcher received SIGTERM, is marked for evacuation
// instead of shut down if its eviction strategy asks for it and, for the LiveMigrate strategies,
// it can be live-migrated. config may be nil (no LifeboatConfig: the gate is off).
func ShouldEvacuateVMI(vmi *v1alpha1.VirtualMachineInstance, dom *Domain, config *v1alpha1.LifeboatConfig) bool {
	if !v1alpha1.FeatureGateEnabled(config, v1alpha1.FeatureGateNodePressureEvictionLiveMigration) {
		return false
	}
	if vmi == nil || dom == nil || vmi.Status.Phase != v1alpha1.VMIRunning || !dom.State.Alive() {
		return false
	}
	// The user's intent to delete wins over an eviction.
	if vmi.DeletionTimestamp != nil {
		return false
	}
	if dom.GracefulShutdown == nil {
		return false
	}
	switch v1alpha1.EffectiveEvictionStrategy(vmi, config) {
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible:
		// A VM no other node can take now (NoTargetNode) is still marked: a node may come or be
		// uncordoned within the grace, and relief and the agents' deadlines act on the mark.
		return dom.NotMigratableReason == ""
	case v1alpha1.EvictionStrategyExternal:
		return true
	default:
		return false
	}
}

// EvictionDeadline is when the kubelet kills a pod it evicted for node pressure at signal:
// after min(pod grace, evictionMaxPodGracePeriod) seconds, and never sooner than the kubelet's
// minimum of one second. maxGrace is nil when the kubelet's setting is unknown; the pod's grace
// is then assumed, and assumed says so.
func EvictionDeadline(signal time.Time, podGrace time.Duration, maxGrace *int64) (deadline time.Time, assumed bool) {
	grace := podGrace
	if maxGrace != nil {
		grace = min(grace, time.Duration(*maxGrace)*time.Second)
	}
	return signal.Add(max(grace, time.Second)), maxGrace == nil
}
