package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vm;vms,categories=lifeboat
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.printableStatus`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Run Strategy",type=string,JSONPath=`.spec.runStrategy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// VirtualMachine is a VM that outlives its instances: by its run strategy the VM controller
// creates its VirtualMachineInstance, makes it again after it ended, or leaves it stopped.
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VirtualMachineSpec `json:"spec"`
	// +optional
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// RunStrategy says when the VM runs (KubeVirt's meanings).
// +kubebuilder:validation:Enum=Always;RerunOnFailure;Once;Manual;Halted
type RunStrategy string

const (
	// RunStrategyAlways: an instance always runs; one that ends, for any reason, is made again.
	RunStrategyAlways RunStrategy = "Always"
	// RunStrategyRerunOnFailure: an instance that failed is made again; one whose guest shut
	// down cleanly is not.
	RunStrategyRerunOnFailure RunStrategy = "RerunOnFailure"
	// RunStrategyOnce: one instance runs, and is never made again.
	RunStrategyOnce RunStrategy = "Once"
	// RunStrategyManual: the VM's owner starts and stops it; an ended instance stays ended.
	RunStrategyManual RunStrategy = "Manual"
	// RunStrategyHalted: no instance runs; a running one is stopped.
	RunStrategyHalted RunStrategy = "Halted"
)

// VirtualMachineSpec is what the VM's owner asks for.
type VirtualMachineSpec struct {
	// RunStrategy says when the VM runs.
	// +kubebuilder:default=Always
	// +optional
	RunStrategy RunStrategy `json:"runStrategy,omitempty"`
	// Template is the instance the VM runs: its labels and annotations, and its spec.
	Template VirtualMachineInstanceTemplateSpec `json:"template"`
}

// VirtualMachineInstanceTemplateSpec is an instance's metadata and spec.
type VirtualMachineInstanceTemplateSpec struct {
	// +optional
	ObjectMeta TemplateMeta               `json:"metadata,omitempty"`
	Spec       VirtualMachineInstanceSpec `json:"spec"`
}

// TemplateMeta is what an instance takes from its template's metadata: its name is the VM's.
type TemplateMeta struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PrintableStatus is a VM's state in a word, as `kubectl get vm` shows it.
type PrintableStatus string

const (
	PrintableStatusStopped            PrintableStatus = "Stopped"
	PrintableStatusStarting           PrintableStatus = "Starting"
	PrintableStatusRunning            PrintableStatus = "Running"
	PrintableStatusMigrating          PrintableStatus = "Migrating"
	PrintableStatusStopping           PrintableStatus = "Stopping"
	PrintableStatusErrorUnschedulable PrintableStatus = "ErrorUnschedulable"
	PrintableStatusFailed             PrintableStatus = "Failed"
	// PrintableStatusWaitingForNode: the instance's node does not answer and is not known to
	// have stopped the guest; the VM is not started elsewhere until it is (its Ready condition
	// says what an admin does).
	PrintableStatusWaitingForNode PrintableStatus = "WaitingForNode"
)

// VirtualMachineStatus is what the VM controller observes of a VM.
type VirtualMachineStatus struct {
	// PrintableStatus is the VM's state in a word.
	// +optional
	PrintableStatus PrintableStatus `json:"printableStatus,omitempty"`
	// Ready is true while the VM's instance is Ready.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// InstanceName is the name of the VM's current instance, if it has one.
	// +optional
	InstanceName string `json:"instanceName,omitempty"`
	// Restarts counts the instances made again after one ended.
	// +optional
	Restarts int32 `json:"restarts,omitempty"`
	// Conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the generation of the spec this status is for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// VirtualMachineList is a list of VirtualMachines.
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachine `json:"items"`
}
