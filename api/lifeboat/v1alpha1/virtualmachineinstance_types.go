package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
// +kubebuilder:validation:XValidation:rule="(has(self.boot) && (has(self.boot.container) || has(self.boot.kernel) || has(self.boot.disk))) || (has(self.disks) && has(self.volumes) && self.disks.exists(d, self.volumes.exists(v, v.name == d.name && (has(v.containerDisk) || has(v.persistentVolumeClaim)))))",message="the VM boots nothing: it needs boot.container (a kernel in a container image), a disk on a containerDisk or persistentVolumeClaim volume, or boot.kernel or boot.disk in a node directory the cluster admin allows"
// +kubebuilder:validation:XValidation:rule="!has(self.disks) || self.disks.all(d, has(self.volumes) && self.volumes.exists(v, v.name == d.name))",message="every disk names a volume of spec.volumes"
// +kubebuilder:validation:XValidation:rule="!has(self.volumes) || self.volumes.all(v, has(self.disks) && self.disks.exists(d, d.name == v.name))",message="every volume is attached by a disk of the same name in spec.disks"
// +kubebuilder:validation:XValidation:rule="!has(self.volumes) || self.volumes.filter(v, has(v.cloudInitNoCloud)).size() <= 1",message="a VM has at most one cloudInitNoCloud volume"
// +kubebuilder:validation:XValidation:rule="!(has(self.boot) && has(self.boot.disk) && has(self.disks))",message="boot.disk (a node file) and spec.disks cannot both be set"
// +kubebuilder:validation:XValidation:rule="!has(self.interfaces) || self.interfaces.all(i, has(self.networks) && self.networks.exists(n, n.name == i.name))",message="every interface names a network of spec.networks"
// +kubebuilder:validation:XValidation:rule="!has(self.networks) || self.networks.all(n, has(self.interfaces) && self.interfaces.exists(i, i.name == n.name))",message="every network is attached by an interface of the same name in spec.interfaces"
// +kubebuilder:validation:XValidation:rule="!has(self.networks) || self.networks.filter(n, has(n.pod)).size() <= 1",message="a VM has at most one interface on the pod network"
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

	// Boot says how the guest boots when it does not boot from its first disk: a kernel (from a
	// container image, or an admin-allowed node file) with an optional initrd and command line.
	// +optional
	Boot BootSource `json:"boot,omitempty"`

	// Disks are the guest's disks, in order: the first is the boot disk unless boot names a
	// kernel. Each names a volume of spec.volumes (KubeVirt's spec.domain.devices.disks).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Disks []Disk `json:"disks,omitempty"`

	// Volumes are where the disks' data comes from (KubeVirt's spec.volumes).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Volumes []Volume `json:"volumes,omitempty"`

	// Interfaces are the guest's network cards, each on the network of spec.networks of the
	// same name, with its binding (KubeVirt's spec.domain.devices.interfaces).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Interfaces []Interface `json:"interfaces,omitempty"`

	// Networks are what the interfaces connect to (KubeVirt's spec.networks). The pod network
	// is the only kind so far.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Networks []Network `json:"networks,omitempty"`

	// EvictionStrategy says what happens when the VM's pod is asked to leave its node.
	// Unset means the LifeboatConfig's evictionStrategy, and None if that is unset too.
	// +optional
	EvictionStrategy *EvictionStrategy `json:"evictionStrategy,omitempty"`

	// Migration tunes how this VM's live migrations may converge.
	// +optional
	Migration *VMIMigration `json:"migration,omitempty"`

	// TerminationGracePeriodSeconds is how long the guest has to shut down after an ACPI
	// power-button press before it is destroyed. The launcher pod's grace period is derived from it.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`

	// NodeSelector restricts the nodes the VM may run on, in addition to lifeboat.dev/kvm=true;
	// lifeboat.dev/ keys are lifeboat's to set.
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('lifeboat.dev/'))",message="nodeSelector cannot name lifeboat.dev/ keys: they are lifeboat's (it sets lifeboat.dev/kvm=true, the nodes lifeboat runs VMs on, on every VM's pod)"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// VMIMigration tunes one VM's live migrations within what the LifeboatConfig allows.
type VMIMigration struct {
	// AllowPostCopy false keeps this VM's migrations out of post-copy even where the
	// LifeboatConfig allows it: a post-copy whose connection breaks and cannot be resumed loses
	// the guest, which some VMs must never risk (they are paused to converge instead, where a
	// pause is allowed). It cannot allow post-copy the LifeboatConfig does not.
	// +optional
	AllowPostCopy *bool `json:"allowPostCopy,omitempty"`
}

// BootSource is what the guest boots from: a kernel and initrd from a container image
// (container), or node files the cluster admin allows (kernel, initrd, disk).
// +kubebuilder:validation:XValidation:rule="!has(self.initrd) || has(self.kernel)",message="boot.initrd needs boot.kernel"
// +kubebuilder:validation:XValidation:rule="!has(self.cmdline) || has(self.kernel) || has(self.container)",message="boot.cmdline needs boot.kernel or boot.container"
// +kubebuilder:validation:XValidation:rule="!has(self.container) || !(has(self.kernel) || has(self.initrd))",message="boot.container holds the kernel and initrd: boot.kernel and boot.initrd cannot be set with it"
type BootSource struct {
	// Container is a container image holding the kernel and initrd for direct kernel boot
	// (KubeVirt's kernelBoot.container). The kubelet pulls it like any image; nothing of the node
	// is named.
	// +optional
	Container *KernelBootContainer `json:"container,omitempty"`
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

// KernelBootContainer is a container image that holds a kernel and an initrd.
type KernelBootContainer struct {
	// Image is the image's reference, as a pod's container image is written.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// ImagePullPolicy is the image's pull policy, as for a container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// KernelPath is the kernel's absolute path inside the image.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')",message="kernelPath must be an absolute path inside the image, without .."
	KernelPath string `json:"kernelPath"`
	// InitrdPath is the initrd's absolute path inside the image.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')",message="initrdPath must be an absolute path inside the image, without .."
	// +optional
	InitrdPath string `json:"initrdPath,omitempty"`
}

// DiskBus is the bus a disk is attached to.
// +kubebuilder:validation:Enum=virtio;sata
type DiskBus string

const (
	// DiskBusVirtio is the default: paravirtual and fast.
	DiskBusVirtio DiskBus = "virtio"
	// DiskBusSATA is for guests without virtio drivers.
	DiskBusSATA DiskBus = "sata"
)

// Disk is one of the guest's disks.
type Disk struct {
	// Name is the volume (spec.volumes) the disk's data comes from.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=58
	Name string `json:"name"`
	// Bus is virtio (the default) or sata.
	// +optional
	Bus DiskBus `json:"bus,omitempty"`
}

// Volume is where a disk's data comes from. Exactly one source is set.
// +kubebuilder:validation:XValidation:rule="[has(self.containerDisk), has(self.persistentVolumeClaim), has(self.cloudInitNoCloud)].filter(x, x).size() == 1",message="a volume needs exactly one source: containerDisk, persistentVolumeClaim or cloudInitNoCloud"
type Volume struct {
	// Name is what a disk names it by. It names the volume in the launcher pod too, after a
	// prefix of lifeboat's: hence 58 characters, not a pod volume's 63.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=58
	Name string `json:"name"`
	// ContainerDisk is a disk image inside a container image. The guest writes to a copy-on-write
	// overlay in its pod; the image is never written.
	// +optional
	ContainerDisk *ContainerDiskSource `json:"containerDisk,omitempty"`
	// PersistentVolumeClaim is a claim in the VMI's namespace that holds the disk as the file
	// disk.img on its file system (written, sparse and filling the claim, when missing).
	// ReadWriteMany claims stay where they are in a migration (both nodes reach them); any other
	// keeps the VM from live-migrating (LiveMigratable False, DisksNotLiveMigratable).
	// +optional
	PersistentVolumeClaim *PersistentVolumeClaimSource `json:"persistentVolumeClaim,omitempty"`
	// CloudInitNoCloud is cloud-init's NoCloud data source: a small disk labelled cidata that a
	// cloud image reads its configuration from at first boot.
	// +optional
	CloudInitNoCloud *CloudInitNoCloudSource `json:"cloudInitNoCloud,omitempty"`
}

// PersistentVolumeClaimSource names a claim in the VMI's namespace.
type PersistentVolumeClaimSource struct {
	// ClaimName is the claim's name.
	// +kubebuilder:validation:MinLength=1
	ClaimName string `json:"claimName"`
}

// VolumeStatus is what the VMI controller found of a volume's claim when it made the VM's pod
// (KubeVirt's status.volumeStatus).
type VolumeStatus struct {
	// Name is the volume's.
	Name string `json:"name"`
	// PersistentVolumeClaimInfo is the claim's, for a persistentVolumeClaim volume.
	// +optional
	PersistentVolumeClaimInfo *PersistentVolumeClaimInfo `json:"persistentVolumeClaimInfo,omitempty"`
}

// PersistentVolumeClaimInfo is a bound claim's access modes, volume mode and capacity.
type PersistentVolumeClaimInfo struct {
	ClaimName string `json:"claimName"`
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	// +optional
	VolumeMode *corev1.PersistentVolumeMode `json:"volumeMode,omitempty"`
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`
}

// ContainerDiskSource is a qcow2 or raw disk image inside a container image, as KubeVirt's
// containerDisk images are built: the image file under /disk/.
type ContainerDiskSource struct {
	// Image is the image's reference, as a pod's container image is written.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// ImagePullPolicy is the image's pull policy, as for a container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Path is the disk image's absolute path inside the container image; unset means the one
	// file under /disk.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')",message="path must be an absolute path inside the image, without .."
	// +optional
	Path string `json:"path,omitempty"`
}

// CloudInitNoCloudSource is the data of a NoCloud seed.
// +kubebuilder:validation:XValidation:rule="has(self.userData) || has(self.userDataSecretRef) || has(self.networkData)",message="cloudInitNoCloud needs userData, userDataSecretRef or networkData"
// +kubebuilder:validation:XValidation:rule="!(has(self.userData) && has(self.userDataSecretRef))",message="cloudInitNoCloud takes userData or userDataSecretRef, not both"
type CloudInitNoCloudSource struct {
	// UserData is cloud-init's user data (a #cloud-config document or a script).
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	UserData string `json:"userData,omitempty"`
	// UserDataSecretRef names a Secret in the VMI's namespace whose key userdata (or userData)
	// is the user data, for user data that holds secrets (passwords, keys). The kubelet mounts
	// it into the VM's pod like any Secret volume; lifeboat's controller never reads it.
	// +optional
	UserDataSecretRef *corev1.LocalObjectReference `json:"userDataSecretRef,omitempty"`
	// NetworkData is cloud-init's network configuration (version 1 or 2).
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	NetworkData string `json:"networkData,omitempty"`
}

// Interface is one of the guest's network cards (virtio). Exactly one binding is set.
// +kubebuilder:validation:XValidation:rule="[has(self.masquerade), has(self.bridge)].filter(x, x).size() == 1",message="an interface needs exactly one binding: masquerade or bridge"
// +kubebuilder:validation:XValidation:rule="!has(self.ports) || has(self.masquerade)",message="ports are for the masquerade binding: a bridge binding gives the guest the pod's address and every port"
// +kubebuilder:validation:XValidation:rule="!has(self.macAddress) || has(self.masquerade)",message="macAddress is for the masquerade binding: a bridge binding gives the guest the pod's own MAC, the one the pod network assigned, since on a node bridge that pods share another MAC could be a neighbour pod's and take its traffic"
type Interface struct {
	// Name is the network (spec.networks) the card is on.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Masquerade puts the guest behind NAT on the pod's address: the guest has a fixed private
	// address (10.0.2.2/24, gateway 10.0.2.1) that a migration does not change, and the pod's
	// address forwards the ports listed (all when none is). Live-migratable.
	// +optional
	Masquerade *InterfaceMasquerade `json:"masquerade,omitempty"`
	// Bridge gives the guest the pod's own address by DHCP. Not live-migratable: the target
	// pod has another address (LiveMigratable False, InterfaceNotLiveMigratable).
	// +optional
	Bridge *InterfaceBridge `json:"bridge,omitempty"`
	// Ports are the ports the pod's address forwards to the guest; none means all.
	// +listType=map
	// +listMapKey=port
	// +listMapKey=protocol
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Ports []Port `json:"ports,omitempty"`
	// MACAddress is the card's MAC address behind masquerade; unset means one derived from
	// the VMI's UID. Either way it never changes while the VMI lives, migrations included.
	// The bridge binding takes none: its guest has the pod's own MAC.
	// +kubebuilder:validation:Pattern=`^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$`
	// +optional
	MACAddress string `json:"macAddress,omitempty"`
}

// InterfaceMasquerade is the masquerade binding; it has no settings.
type InterfaceMasquerade struct{}

// InterfaceBridge is the bridge binding; it has no settings.
type InterfaceBridge struct{}

// Port is a port the pod forwards to the guest.
type Port struct {
	// Name names the port for people.
	// +kubebuilder:validation:MaxLength=15
	// +optional
	Name string `json:"name,omitempty"`
	// Protocol is TCP (the default) or UDP.
	// +kubebuilder:validation:Enum=TCP;UDP
	// +kubebuilder:default=TCP
	// +optional
	Protocol corev1.Protocol `json:"protocol,omitempty"`
	// Port is the port number, on the pod's address and in the guest.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// Network is what an interface connects to. Exactly one kind is set.
// +kubebuilder:validation:XValidation:rule="has(self.pod)",message="a network needs a kind: pod"
type Network struct {
	// Name is what an interface names it by.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// Pod is the pod network: the launcher pod's own network namespace.
	// +optional
	Pod *PodNetwork `json:"pod,omitempty"`
}

// PodNetwork is the pod network; it has no settings.
type PodNetwork struct{}

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
	// VMIConditionNodeLost is true while the node the guest runs on does not answer (NotReady)
	// and is not known to have stopped it: the VMI waits, neither failed nor restarted
	// elsewhere. Its message says what an admin does about it.
	VMIConditionNodeLost = "NodeLost"
)

// Reasons of the LiveMigratable condition that more than one component writes. The agent owns
// the condition for the domain's own reasons; the evacuation controller sets NoTargetNode over a
// True condition, and back, as the nodes change.
const (
	// VMIReasonMigratable: the condition is True.
	VMIReasonMigratable = "Migratable"
	// VMIReasonNoTargetNode: the domain could move, but no node other than its own could take
	// its target pod (its nodeSelector, the nodes' labels, cordons, taints, allocatable memory);
	// the message says what keeps each node out.
	VMIReasonNoTargetNode = "NoTargetNode"
)

// VMIReasonGuestNotRunning is the reason of the Ready condition the node's agent writes when
// the guest's domain exists but does not run (shut off): a VMI controller whose node stopped
// answering takes it as the agent's report that the guest is gone.
const VMIReasonGuestNotRunning = "GuestNotRunning"

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
	// LauncherPod is the launcher pod the guest runs in, as lifeboat's controller made it (and a
	// completed migration moved it): the node's agent binds the VM's sockets and libvirt
	// connection to this pod only, never to one that merely carries lifeboat's labels.
	// +optional
	LauncherPod *LauncherPodRef `json:"launcherPod,omitempty"`
	// EvacuationNodeName, when equal to NodeName, marks the VMI for evacuation from that node.
	// +optional
	EvacuationNodeName string `json:"evacuationNodeName,omitempty"`
	// EvacuationDeadline is when the VM must have left EvacuationNodeName: for node pressure,
	// when the kubelet kills the launcher pod (signal time + min(pod grace, evictionMaxPodGracePeriod)).
	// +optional
	EvacuationDeadline *metav1.Time `json:"evacuationDeadline,omitempty"`
	// Conditions: Ready, LiveMigratable, EvictionRequested, NodeLost.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// VolumeStatus records the claims of persistentVolumeClaim volumes, as found when the VM's
	// pod was made.
	// +listType=map
	// +listMapKey=name
	// +optional
	VolumeStatus []VolumeStatus `json:"volumeStatus,omitempty"`
	// MigrationState describes the latest migration of this VMI.
	// +optional
	MigrationState *VirtualMachineInstanceMigrationState `json:"migrationState,omitempty"`
}

// LauncherPodRef names a launcher pod in the VMI's namespace by name and UID: a pod deleted and
// made again under the same name is another pod.
type LauncherPodRef struct {
	// Name is the pod's name.
	Name string `json:"name"`
	// UID is the pod's UID.
	UID types.UID `json:"uid"`
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
	// TargetNodeDomainReadyTimestamp is when the target node's agent saw the guest run in its
	// launcher (KubeVirt's name): from then on the guest lives on the target, whatever the
	// source still has to say, so its target pod is never deleted as a failed migration's.
	// +optional
	TargetNodeDomainReadyTimestamp *metav1.Time `json:"targetNodeDomainReadyTimestamp,omitempty"`
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
	// DowntimeMilliseconds is how long the migration stopped the guest, as libvirt measured it on
	// the target: the target node's agent records it a moment after the guest runs there. Unset
	// while the migration runs, when it failed, or when libvirt kept no figure.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DowntimeMilliseconds *int64 `json:"downtimeMilliseconds,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// VirtualMachineInstanceList is a list of VirtualMachineInstances.
type VirtualMachineInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstance `json:"items"`
}
