package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmi;vmis,categories=lifeboat
// +kubebuilder:selectablefield:JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Evacuation Node",type=string,JSONPath=`.status.evacuationNodeName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// VirtualMachineInstance is a running virtual machine: one guest, in one launcher pod, on one node at a time.
type VirtualMachineInstance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineInstanceSpec `json:"spec"`
	// +optional
	Status VirtualMachineInstanceStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceSpec is what the VM's owner asks for.
type VirtualMachineInstanceSpec struct {
	// CPUs is the number of virtual CPUs the guest sees.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=512
	// +kubebuilder:default=1
	// +optional
	CPUs int32 `json:"cpus,omitempty"`

	// Memory is the guest's memory, for example 256Mi. The launcher pod requests it plus an overhead.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="memory must be greater than zero, for example 256Mi"
	Memory resource.Quantity `json:"memory"`

	// Boot says what the guest boots: a kernel with an optional initrd and command line, a disk image, or both.
	Boot BootSource `json:"boot"`

	// EvictionStrategy says what happens when the VM's pod is asked to leave its node.
	// Unset means the LifeboatConfig's evictionStrategy, and None if that is unset too.
	// +optional
	EvictionStrategy *EvictionStrategy `json:"evictionStrategy,omitempty"`

	// TerminationGracePeriodSeconds is how long the guest has to shut down after an ACPI
	// power-button press before it is destroyed. The launcher pod's grace period is derived from it.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`

	// NodeSelector restricts the nodes the VM may run on, in addition to lifeboat.dev/kvm=true,
	// which is lifeboat's to set.
	// +kubebuilder:validation:XValidation:rule="!('lifeboat.dev/kvm' in self)",message="nodeSelector cannot name lifeboat.dev/kvm: lifeboat sets it on every VM's pod (lifeboat.dev/kvm=true, the nodes lifeboat runs VMs on)"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// BootSource is what the guest boots from. Paths are on the node, as the launcher sees them.
// +kubebuilder:validation:XValidation:rule="has(self.kernel) || has(self.disk)",message="boot needs a kernel, a disk image, or both"
// +kubebuilder:validation:XValidation:rule="!has(self.initrd) || has(self.kernel)",message="boot.initrd needs boot.kernel"
// +kubebuilder:validation:XValidation:rule="!has(self.cmdline) || has(self.kernel)",message="boot.cmdline needs boot.kernel"
type BootSource struct {
	// Kernel is the path of a kernel image for direct kernel boot.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Kernel string `json:"kernel,omitempty"`
	// Initrd is the path of an initial ramdisk for the kernel.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Initrd string `json:"initrd,omitempty"`
	// Cmdline is the kernel command line.
	// +optional
	Cmdline string `json:"cmdline,omitempty"`
	// Disk is the path of a disk image attached as the guest's first disk.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Disk string `json:"disk,omitempty"`
}

// VirtualMachineInstancePhase is where a VMI is in its life.
// +kubebuilder:validation:Enum=Pending;Scheduling;Scheduled;Running;Succeeded;Failed
type VirtualMachineInstancePhase string

const (
	// VMIPending: accepted, no launcher pod yet.
	VMIPending VirtualMachineInstancePhase = "Pending"
	// VMIScheduling: the launcher pod exists and waits for a node.
	VMIScheduling VirtualMachineInstancePhase = "Scheduling"
	// VMIScheduled: the launcher pod is on a node and the guest is being started.
	VMIScheduled VirtualMachineInstancePhase = "Scheduled"
	// VMIRunning: the guest runs.
	VMIRunning VirtualMachineInstancePhase = "Running"
	// VMISucceeded: the guest shut down and will not run again.
	VMISucceeded VirtualMachineInstancePhase = "Succeeded"
	// VMIFailed: the guest or its pod ended abnormally.
	VMIFailed VirtualMachineInstancePhase = "Failed"
)

// Condition types on a VirtualMachineInstance.
const (
	// VMIConditionReady is true while the guest runs and its launcher is ready.
	VMIConditionReady = "Ready"
	// VMIConditionLiveMigratable is true when the VM can be live-migrated; its reason says why not when false.
	VMIConditionLiveMigratable = "LiveMigratable"
	// VMIConditionEvictionRequested is true while the VM is marked for evacuation; its reason is the cause.
	VMIConditionEvictionRequested = "EvictionRequested"
)

// VirtualMachineInstanceStatus is what lifeboat observes of a VMI.
type VirtualMachineInstanceStatus struct {
	// Phase is where the VMI is in its life.
	// +optional
	Phase VirtualMachineInstancePhase `json:"phase,omitempty"`
	// Reason is a CamelCase word saying why the VMI is in its phase, for Failed and Succeeded.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message says the same for a person.
	// +optional
	Message string `json:"message,omitempty"`
	// NodeName is the node the guest runs on.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// EvacuationNodeName, when equal to NodeName, marks the VMI for evacuation from that node.
	// +optional
	EvacuationNodeName string `json:"evacuationNodeName,omitempty"`
	// EvacuationDeadline is when the VM must have left EvacuationNodeName: for node pressure,
	// when the kubelet kills the launcher pod (signal time + min(pod grace, evictionMaxPodGracePeriod)).
	// +optional
	EvacuationDeadline *metav1.Time `json:"evacuationDeadline,omitempty"`
	// Conditions: Ready, LiveMigratable, EvictionRequested.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// MigrationState describes the latest migration of this VMI.
	// +optional
	MigrationState *VirtualMachineInstanceMigrationState `json:"migrationState,omitempty"`
}

// VirtualMachineInstanceMigrationState is the VMI's record of its latest migration.
type VirtualMachineInstanceMigrationState struct {
	// MigrationName is the VirtualMachineInstanceMigration that performs it.
	// +optional
	MigrationName string `json:"migrationName,omitempty"`
	// MigrationUID is that migration's UID.
	// +optional
	MigrationUID string `json:"migrationUID,omitempty"`
	// SourceNode is the node the guest leaves.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// TargetNode is the node the guest goes to.
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// StartTimestamp is when the memory transfer started.
	// +optional
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
	// EndTimestamp is when it ended, successfully or not.
	// +optional
	EndTimestamp *metav1.Time `json:"endTimestamp,omitempty"`
	// Completed is true once the guest runs on the target.
	// +optional
	Completed bool `json:"completed,omitempty"`
	// Failed is true when the migration ended without moving the guest.
	// +optional
	Failed bool `json:"failed,omitempty"`
	// Mode is the furthest convergence mode the migration used.
	// +optional
	Mode MigrationMode `json:"mode,omitempty"`
	// Cause is why the migration was made.
	// +optional
	Cause MigrationCause `json:"cause,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// VirtualMachineInstanceList is a list of VirtualMachineInstances.
type VirtualMachineInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstance `json:"items"`
}
