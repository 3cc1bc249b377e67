package v1alpha1

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// VMIController is obj's controller reference when a VirtualMachineInstance controls it, as one
// controls each launcher pod; nil otherwise.
func VMIController(obj metav1.Object) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.Kind != "VirtualMachineInstance" || ref.APIVersion != SchemeGroupVersion.String() {
		return nil
	}
	return ref
}

// EffectiveEvictionStrategy is the VMI's own strategy, else the cluster's, else None.
// config may be nil (no LifeboatConfig exists).
func EffectiveEvictionStrategy(vmi *VirtualMachineInstance, config *LifeboatConfig) EvictionStrategy {
	if vmi.Spec.EvictionStrategy != nil {
		return *vmi.Spec.EvictionStrategy
	}
	if config != nil && config.Spec.EvictionStrategy != nil {
		return *config.Spec.EvictionStrategy
	}
	return EvictionStrategyNone
}

// PostCopyAllowed says whether the VMI's migrations may switch to post-copy: the cluster's
// spec.migrations.allowPostCopy (off when unset), unless the VMI opts out.
func PostCopyAllowed(config *LifeboatConfig, vmi *VirtualMachineInstance) bool {
	if config == nil || config.Spec.Migrations.AllowPostCopy == nil || !*config.Spec.Migrations.AllowPostCopy {
		return false
	}
	return vmi == nil || vmi.Spec.Migration == nil || vmi.Spec.Migration.AllowPostCopy == nil || *vmi.Spec.Migration.AllowPostCopy
}

// FeatureGateEnabled reports whether the cluster's configuration turns gate on; config may be nil.
func FeatureGateEnabled(config *LifeboatConfig, gate FeatureGate) bool {
	if config == nil {
		return false
	}
	for _, g := range config.Spec.FeatureGates {
		if g == gate {
			return true
		}
	}
	return false
}

// Terminal reports whether a VMI in this phase has ended for good.
func (p VirtualMachineInstancePhase) Terminal() bool { return p == VMISucceeded || p == VMIFailed }

// Terminal reports whether a migration in this phase has ended.
func (p VirtualMachineInstanceMigrationPhase) Terminal() bool {
	return p == MigrationSucceeded || p == MigrationFailed
}

// EvacuatedVMI is the UID of the VMI the evacuation controller recorded, in the migration's
// status, that it made this migration to move; "" for any other migration, whatever its labels.
func (m *VirtualMachineInstanceMigration) EvacuatedVMI() types.UID {
	if m.Status.Evacuation == nil {
		return ""
	}
	return types.UID(m.Status.Evacuation.VMIUID)
}

// WaitingForSlot reports whether m is an evacuation's migration made ahead of a free
// parallel-migration slot, whose memory transfer must not start yet.
func (m *VirtualMachineInstanceMigration) WaitingForSlot() bool {
	return m.Status.Evacuation != nil && m.Status.Evacuation.WaitingForSlot
}

// SlotAfter is the UID of the migration whose slot m, waiting for one, takes when that one's
// transfer ends (status.evacuation.slotAfterUID); "" when m waits for the controller alone.
func (m *VirtualMachineInstanceMigration) SlotAfter() string {
	if !m.WaitingForSlot() {
		return ""
	}
	return m.Status.Evacuation.SlotAfterUID
}

// ClaimInfo is what statuses record of volume's claim, or nil.
func ClaimInfo(statuses []VolumeStatus, volume string) *PersistentVolumeClaimInfo {
	for _, s := range statuses {
		if s.Name == volume {
			return s.PersistentVolumeClaimInfo
		}
	}
	return nil
}

// ReadWriteMany reports whether statuses record volume's claim, and whether its access modes
// let many nodes mount it (ReadWriteMany), as a migration needs.
func ReadWriteMany(statuses []VolumeStatus, volume string) (recorded, rwx bool) {
	info := ClaimInfo(statuses, volume)
	return info != nil, info != nil && slices.Contains(info.AccessModes, corev1.ReadWriteMany)
}

// BlockClaim reports whether statuses record volume's claim as a Block volume: the claim is the
// disk itself, a device in the launcher pod, rather than a file system holding a disk.img.
func BlockClaim(statuses []VolumeStatus, volume string) bool {
	info := ClaimInfo(statuses, volume)
	return info != nil && info.VolumeMode != nil && *info.VolumeMode == corev1.PersistentVolumeBlock
}

// DefaultUnauthenticatedMigrationInterval is spec.evictionWebhook.unauthenticatedMigrationInterval's default.
const DefaultUnauthenticatedMigrationInterval = time.Hour

// UnauthenticatedMigrationInterval is how often a review the eviction webhook cannot authenticate
// may mark one VMI whose node is not cordoned; config may be nil.
func UnauthenticatedMigrationInterval(config *LifeboatConfig) time.Duration {
	if config == nil || config.Spec.EvictionWebhook.UnauthenticatedMigrationInterval == nil {
		return DefaultUnauthenticatedMigrationInterval
	}
	return config.Spec.EvictionWebhook.UnauthenticatedMigrationInterval.Duration
}
