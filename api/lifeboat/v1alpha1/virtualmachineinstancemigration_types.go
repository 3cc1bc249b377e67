package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmim;vmims,categories=lifeboat
// +kubebuilder:printcolumn:name="VMI",type=string,JSONPath=`.spec.vmiName`
// +kubebuilder:printcolumn:name="Cause",type=string,JSONPath=`.status.cause`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.status.sourceNode`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.targetNode`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:selectablefield:JSONPath=`.status.sourceNode`
// +kubebuilder:selectablefield:JSONPath=`.status.targetNode`

// VirtualMachineInstanceMigration moves one VMI from its node to another by live migration.
type VirtualMachineInstanceMigration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineInstanceMigrationSpec `json:"spec"`
	// +optional
	Status VirtualMachineInstanceMigrationStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceMigrationSpec names the VMI to move.
type VirtualMachineInstanceMigrationSpec struct {
	// VMIName is the VirtualMachineInstance, in the migration's namespace, to move.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vmiName cannot be changed"
	VMIName string `json:"vmiName"`
}

// VirtualMachineInstanceMigrationPhase is where a migration is.
// +kubebuilder:validation:Enum=Pending;Scheduling;Scheduled;PreparingTarget;TargetReady;Running;Succeeded;Failed
type VirtualMachineInstanceMigrationPhase string

const (
	// MigrationPending: accepted, no target pod yet.
	MigrationPending VirtualMachineInstanceMigrationPhase = "Pending"
	// MigrationScheduling: the target pod exists and waits for a node.
	MigrationScheduling VirtualMachineInstanceMigrationPhase = "Scheduling"
	// MigrationScheduled: the target pod is on a node.
	MigrationScheduled VirtualMachineInstanceMigrationPhase = "Scheduled"
	// MigrationPreparingTarget: the target agent prepares to receive the guest.
	MigrationPreparingTarget VirtualMachineInstanceMigrationPhase = "PreparingTarget"
	// MigrationTargetReady: the target listens for the guest's memory.
	MigrationTargetReady VirtualMachineInstanceMigrationPhase = "TargetReady"
	// MigrationRunning: memory is being transferred.
	MigrationRunning VirtualMachineInstanceMigrationPhase = "Running"
	// MigrationSucceeded: the guest runs on the target.
	MigrationSucceeded VirtualMachineInstanceMigrationPhase = "Succeeded"
	// MigrationFailed: the guest still runs on the source; FailureReason says why.
	MigrationFailed VirtualMachineInstanceMigrationPhase = "Failed"
)

// VirtualMachineInstanceMigrationStatus is the progress of a migration.
type VirtualMachineInstanceMigrationStatus struct {
	// Phase is where the migration is.
	// +optional
	Phase VirtualMachineInstanceMigrationPhase `json:"phase,omitempty"`
	// Cause is why the migration was made.
	// +optional
	Cause MigrationCause `json:"cause,omitempty"`
	// Deadline is when the guest must have left the source node; for node pressure, when the kubelet kills the source pod.
	// +optional
	Deadline *metav1.Time `json:"deadline,omitempty"`
	// SourceNode is the node the guest leaves.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// TargetNode is the node the guest goes to.
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// TargetPod is the launcher pod that receives the guest.
	// +optional
	TargetPod string `json:"targetPod,omitempty"`
	// TargetPodUID is that pod's UID, as lifeboat's controller made it: the target node's agent
	// binds the migration's proxies to this pod only.
	// +optional
	TargetPodUID types.UID `json:"targetPodUID,omitempty"`
	// TargetProxy is where the target node's agent listens for this migration, set when the
	// target is ready; the source node's agent forwards the migration there.
	// +optional
	TargetProxy *MigrationProxy `json:"targetProxy,omitempty"`
	// Mode is the furthest convergence mode used so far.
	// +optional
	Mode MigrationMode `json:"mode,omitempty"`
	// StartTimestamp is when the memory transfer started.
	// +optional
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
	// EndTimestamp is when the migration ended, successfully or not.
	// +optional
	EndTimestamp *metav1.Time `json:"endTimestamp,omitempty"`
	// PhaseTransitionTimestamps records when each phase was entered.
	// +listType=map
	// +listMapKey=phase
	// +optional
	PhaseTransitionTimestamps []MigrationPhaseTransition `json:"phaseTransitionTimestamps,omitempty"`
	// FailureReason says why a failed migration failed.
	// +optional
	FailureReason string `json:"failureReason,omitempty"`
	// TargetUnschedulable is true when the migration failed because no node would take its
	// target pod: another attempt waits until the cluster's nodes or their free capacity change.
	// +optional
	TargetUnschedulable bool `json:"targetUnschedulable,omitempty"`
	// Progress is the memory transfer's latest figures, written by the source agent while it runs.
	// +optional
	Progress *MigrationProgress `json:"progress,omitempty"`
	// Evacuation is the evacuation controller's record that it made this migration for an
	// evacuation mark, written through the status subresource right after it created the
	// migration. Labels and annotations are the creator's to choose; status is not (the API
	// server drops it from creates and from writes to the migration itself), so only a migration
	// with this record counts against the evacuation limits and in its VMI's evacuation backoff.
	// A migration without it is Manual.
	// +optional
	Evacuation *MigrationEvacuation `json:"evacuation,omitempty"`
}

// MigrationEvacuation identifies the VMI an evacuation migration moves, as the evacuation
// controller saw it.
type MigrationEvacuation struct {
	// VMIUID is the UID of the VMI the migration moves off its node.
	// +kubebuilder:validation:MinLength=1
	VMIUID string `json:"vmiUID"`
	// WaitingForSlot is true while the migration waits for one of the parallel-migration slots
	// (spec.migrations.parallelMigrationsPerCluster, parallelOutboundMigrationsPerNode): the
	// evacuation controller made it ahead of a free slot so that its target (pod, launcher,
	// libvirt) is ready when one frees. Its source agent starts no memory transfer until the
	// controller clears this; until then the VM is untouched and the migration stops at
	// TargetReady.
	// +optional
	WaitingForSlot bool `json:"waitingForSlot,omitempty"`
	// SlotAfterUID, on a migration waiting for a slot whose target is ready, is the UID of a
	// migration moving memory from the same node, whose slot this one takes when that one's
	// transfer ends: its source agent, which runs both, starts this one at that moment instead
	// of waiting for the controller to clear WaitingForSlot (which it then does). The
	// evacuation controller sets it for the most urgent migrations waiting, one per migration
	// under way.
	// +optional
	SlotAfterUID string `json:"slotAfterUID,omitempty"`
}

// MigrationProgress is a running migration's transfer, as libvirt reports it.
type MigrationProgress struct {
	// DataTotal and DataRemaining are bytes of the whole transfer.
	DataTotal     int64 `json:"dataTotal"`
	DataRemaining int64 `json:"dataRemaining"`
	// MemoryDirtyRate is how fast the guest dirties memory, in bytes per second.
	// +optional
	MemoryDirtyRate int64 `json:"memoryDirtyRate,omitempty"`
	// MemoryBandwidth is how fast memory is sent, in bytes per second.
	// +optional
	MemoryBandwidth int64 `json:"memoryBandwidth,omitempty"`
	// UpdateTime is when these figures were read.
	UpdateTime metav1.Time `json:"updateTime"`
}

// MigrationProxy is the TCP endpoints (host:port) a target agent serves for one migration.
type MigrationProxy struct {
	// Libvirt reaches the target launcher's libvirt daemon.
	Libvirt string `json:"libvirt"`
	// Memory reaches the target QEMU's incoming migration stream.
	Memory string `json:"memory"`
	// Disks reaches the target QEMU's NBD server, which receives the copy of the disks the
	// guest writes in its pod (containerDisk overlays).
	// +optional
	Disks string `json:"disks,omitempty"`
	// PostCopy is true when the target launcher was given a userfaultfd (devices.lifeboat.dev/userfaultfd),
	// which its QEMU needs to receive a guest in post-copy; without it the migration converges
	// without post-copy.
	// +optional
	PostCopy bool `json:"postCopy,omitempty"`
}

// MigrationPhaseTransition is when a migration entered a phase.
type MigrationPhaseTransition struct {
	// Phase is the phase entered.
	Phase VirtualMachineInstanceMigrationPhase `json:"phase"`
	// Timestamp is when.
	Timestamp metav1.Time `json:"timestamp"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// VirtualMachineInstanceMigrationList is a list of VirtualMachineInstanceMigrations.
type VirtualMachineInstanceMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstanceMigration `json:"items"`
}
