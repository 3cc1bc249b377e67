package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Labels, annotations and finalizers lifeboat puts on objects.
const (
	// LabelVMIName and LabelVMIUID on a launcher pod name the VMI it runs.
	LabelVMIName = "lifeboat.dev/vmi-name"
	LabelVMIUID  = "lifeboat.dev/vmi-uid"
	// LabelRole is "launcher" on every launcher pod.
	LabelRole    = "lifeboat.dev/role"
	RoleLauncher = "launcher"
	// LabelKVMNode marks the nodes lifeboat runs VMs on.
	LabelKVMNode = "lifeboat.dev/kvm"
	// LabelMemoryPressureRelief is "true" on a Node whose agent finds its memory.available
	// within the node-pressure relief margin: migrations do not target it, so VMs moved off one
	// node under pressure do not land on another.
	LabelMemoryPressureRelief = "lifeboat.dev/memory-pressure-relief"
	// AnnotationEvictionExposure on a Node is its agent's NodeEvictionExposure (JSON): what the
	// node kubelet's eviction settings mean for the VMs on it.
	AnnotationEvictionExposure = "lifeboat.dev/eviction-exposure"
	// LabelEvacuation is "true" on the migrations the evacuation controller makes for a mark.
	LabelEvacuation = "lifeboat.dev/evacuation"
	// AnnotationCause and AnnotationDeadline (RFC 3339) on a new migration say why it is made and
	// by when; the migration controller records them in its status. Without them the cause is Manual.
	AnnotationCause    = "lifeboat.dev/cause"
	AnnotationDeadline = "lifeboat.dev/deadline"
	// AnnotationPreferOtherNodes on a new migration names, comma-separated, the nodes its
	// target pod should avoid if another can take it: those where earlier attempts of the same
	// evacuation failed. A preference only: with no other node, the target goes there again.
	AnnotationPreferOtherNodes = "lifeboat.dev/prefer-other-nodes"
	// EvictionResponderName is lifeboat's name as a responder to lifecycle.k8s.io Evictions: launcher
	// pods declare it in spec.evictionResponders, and Evictions of such pods carry it as a label key.
	EvictionResponderName = "lifeboat.dev/evacuation"
	// FinalizerShutdown keeps a deleted VMI until its guest has shut down and its pod is gone.
	FinalizerShutdown = "lifeboat.dev/shutdown"
)

// EvictionResponderPriority is the priority the API asks of the responder that is the pod's
// managing controller: above it, others can preempt lifeboat; below it, they can be its fallback.
const EvictionResponderPriority int32 = 10000

// PodConditionGuestRunning is the readiness gate of the launcher pods of VMs on the pod
// network: True while the guest runs in that pod, so that a Service selecting the VM sends
// connections only to the pod the guest is in (a migration target's pod only once the guest
// has arrived there). The VMI controller sets it.
const PodConditionGuestRunning corev1.PodConditionType = GroupName + "/guest-running"

// Extended resources the node agents' device plugins serve: DeviceResourcePrefix + kvm, tun,
// userfaultfd. Launcher pods ask for the devices their VM needs; no other pod may
// (manifests/launcher-devices.yaml).
const (
	DeviceResourcePrefix = "devices.lifeboat.dev/"
	DeviceKVM            = DeviceResourcePrefix + "kvm"
	DeviceTun            = DeviceResourcePrefix + "tun"
	// DeviceUserFaultFD lets an unprivileged QEMU take the kernel's page faults, which a
	// migration target needs for post-copy.
	DeviceUserFaultFD = DeviceResourcePrefix + "userfaultfd"
)
