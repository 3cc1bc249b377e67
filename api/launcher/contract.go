// Package launcher is the contract between the VMI controller, which builds launcher pods,
// and the launcher, which runs in them: what the pod passes and where things live.
package launcher

import "github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"

const (
	// ContainerName is the launcher pod's one container.
	ContainerName = "compute"
	// Command is what the container runs.
	Command = "lifeboat-launcher"
	// RunDir is the agent's directory on the node.
	RunDir = "/var/run/lifeboat"
	// DomainsDir/<vmi-uid> is, on the node, the agent's link to a launcher's directory: its
	// pod's run volume. The directory holds the launcher's libvirt socket (libvirt-sock), the
	// guest's console log (console.log) and the agent's notify socket for that launcher
	// (notify.sock); in the pod it is PodRunDir.
	DomainsDir = RunDir + "/domains"
	// RunVolume is the launcher pod's emptyDir volume mounted at PodRunDir.
	RunVolume = "run"
	// LibvirtSocket, ConsoleLog, ConsoleSocket and NotifySocketName are the file names inside a
	// launcher's directory. ConsoleSocket is the serial console QEMU serves to one client at a
	// time (`lifeboat-launcher console`, run in the pod by `kubectl lifeboat console`);
	// ConsoleLock is held by that client.
	LibvirtSocket    = "libvirt-sock"
	ConsoleLog       = "console.log"
	ConsoleSocket    = "console.sock"
	ConsoleLock      = "console.lock"
	NotifySocketName = "notify.sock"
	// UID and GID are the user and group the launcher container runs as (KubeVirt's qemu user,
	// 107): never root. The pod's fsGroup is GID, so its volumes are the launcher's to write.
	UID = 107
	GID = 107
	// QEMUProbeApp is the app.kubernetes.io/name label of the QEMU probe's pods (the DaemonSet
	// lifeboat-qemu-probe in lifeboat's namespace, manifests/qemu-probe.yaml), one per KVM node:
	// lifeboat-launcher probe-qemu, run with the launchers' image, user and devices, writes
	// QEMUProbeFile in its emptyDir QEMUProbeVolume (mounted at QEMUProbeDir), which the node's
	// agent reads through the kubelet's pod directory and gives each new launcher.
	QEMUProbeApp    = "lifeboat-qemu-probe"
	QEMUProbeVolume = "qemu-capabilities"
	QEMUProbeDir    = "/var/run/lifeboat-qemu"
	QEMUProbeFile   = "capabilities.xml"
	// DHCPPort is DHCP's server port, where the launcher's unprivileged user answers its guest:
	// the pod of a VM on the pod network lets users bind ports from it up.
	DHCPPort = 67

	// VMDir holds what the launcher container has of its own VM: the images its pod mounts as
	// image volumes and the pod's emptyDir for the disks it writes. Nothing in it is the node's.
	VMDir = "/var/run/lifeboat-vm"
	// PodRunDir is the launcher's directory in its pod, the same in every launcher pod: a
	// migration's socket paths mean the same in the source and the target pod. Short, because
	// libvirt's and QEMU's unix sockets live under it (a socket path holds 107 bytes).
	PodRunDir = VMDir + "/run"
	// KernelBootDir is the image volume of spec.boot.container.
	KernelBootDir = VMDir + "/kernel-boot"
	// ContainerDisksDir holds one image volume per containerDisk volume, named as the volume.
	ContainerDisksDir = VMDir + "/container-disks"
	// StateDir is the pod's emptyDir: containerDisk overlays and the cloud-init seed.
	StateDir = VMDir + "/state"
	// ClaimsDir holds one mount per persistentVolumeClaim volume, named as the volume; the disk
	// is its ClaimDiskFile.
	ClaimsDir     = VMDir + "/claims"
	ClaimDiskFile = "disk.img"
	// ClaimDevicesDir holds the block device of each Block-mode persistentVolumeClaim volume,
	// named as the volume: the claim is the disk.
	ClaimDevicesDir = VMDir + "/claim-devices"
	// SecretsDir holds one Secret volume per cloudInitNoCloud volume with a userDataSecretRef,
	// named as the volume.
	SecretsDir = VMDir + "/secrets"

	// EnvVMI holds a VMI (as VMI, JSON).
	EnvVMI = "LIFEBOAT_VMI"
	// EnvPodGracePeriod holds the pod's terminationGracePeriodSeconds, reported with SIGTERM.
	EnvPodGracePeriod = "LIFEBOAT_POD_GRACE_PERIOD_SECONDS"
	// EnvNodeDirectories holds the allowed node directories the pod mounts (a JSON list); the
	// launcher refuses a boot file that resolves out of its directory.
	EnvNodeDirectories = "LIFEBOAT_NODE_DIRECTORIES"
	// EnvMigrationTarget, when set (to the migration's UID), makes the launcher a migration
	// target: it runs its libvirtd and waits for the domain to arrive instead of starting one.
	EnvMigrationTarget = "LIFEBOAT_MIGRATION_TARGET"
	// LabelMigrationUID on a target launcher pod names its migration.
	LabelMigrationUID = "lifeboat.dev/migration-uid"
)

// VMI is what a launcher is told of its VMI: enough to define the domain and to identify itself.
type VMI struct {
	Namespace string                              `json:"namespace"`
	Name      string                              `json:"name"`
	UID       string                              `json:"uid"`
	Spec      v1alpha1.VirtualMachineInstanceSpec `json:"spec"`
	// VolumeStatus is the VMI's record of its claims (access modes): a ReadWriteMany claim's disk
	// is attached as shared.
	VolumeStatus []v1alpha1.VolumeStatus `json:"volumeStatus,omitempty"`
}

// Exit codes of the launcher: how its VM ended. The pod's container status carries them.
const (
	// ExitGuestPoweredOff: the guest shut down (ACPI or from inside).
	ExitGuestPoweredOff = 0
	// ExitFailed: the launcher could not start or keep its domain.
	ExitFailed = 1
	// ExitDestroyed: the guest was destroyed (it did not power off in time).
	ExitDestroyed = 2
	// ExitCrashed: the guest crashed.
	ExitCrashed = 3
)
