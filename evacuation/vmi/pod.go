package vmi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Sizing of the launcher pod around the guest. The kubelet ranks pods for node-pressure
// eviction by usage above requests, so the request must cover what the pod really uses.
const (
	// DefaultGuestGracePeriodSeconds is the guest's ACPI shutdown time when the VMI sets none (KubeVirt's default).
	DefaultGuestGracePeriodSeconds = 30
	// PodGraceMarginSeconds is added to the guest's grace period for the pod: the time to
	// destroy a guest that ignored ACPI, stop libvirtd and exit before the kubelet's SIGKILL.
	PodGraceMarginSeconds = 15
	// CPURequestPerVCPUMilli is the CPU request per guest vCPU: a 1:10 overcommit, as KubeVirt defaults to.
	CPURequestPerVCPUMilli = 100
)

// What a launcher pod holds besides the guest's RAM, per term, as test/e2e's
// TestTheLauncherPodAsksForWhatItUses measures it (RSS of the launcher, its libvirtd, and QEMU
// less its guest RAM; TCG, 2026-11-26): 171.8 MiB with 1 vCPU and 256 MiB, 179.2 MiB with 2 vCPUs,
// 171.4 MiB with 1 vCPU and 1 GiB. That test keeps these terms within 24 MiB above the truth.
const (
	// fixedOverheadMiB: the launcher (about 30), its libvirtd (about 28) and QEMU's own memory
	// (about 106: its code, heap and, under TCG, the translation cache, which KVM does not have):
	// 164 measured, and 8 of headroom for what a guest running longer adds (TCG's cache grows).
	fixedOverheadMiB = 172
	// perVCPUOverheadMiB: each vCPU's thread and QEMU's per-CPU state (7.4 MiB measured).
	perVCPUOverheadMiB = 8
	// pageTableDivisor: the kernel's page tables for the guest's RAM, 8 bytes per 4 KiB page
	// (2 MiB per GiB), which the pod's cgroup is charged for and no process's RSS shows.
	pageTableDivisor = 512
)

// MemoryRequest is the launcher pod's memory request for a guest of memory and cpus vCPUs: the
// guest's memory and the overhead above, term by term. The kubelet ranks pods for node-pressure
// eviction by their usage above their requests, so a request below the truth would make a VM the
// first pod evicted. There is no limit, as KubeVirt sets none by default: an OOM kill loses the VM.
func MemoryRequest(guest resource.Quantity, cpus int32) resource.Quantity {
	total := guest.Value() + (fixedOverheadMiB+perVCPUOverheadMiB*int64(max(cpus, 1)))<<20 + guest.Value()/pageTableDivisor
	return *resource.NewQuantity(total, resource.BinarySI)
}

// PodGracePeriodSeconds is the launcher pod's grace period for a VMI.
func PodGracePeriodSeconds(vmi *v1alpha1.VirtualMachineInstance) int64 {
	guest := int64(DefaultGuestGracePeriodSeconds)
	if vmi.Spec.TerminationGracePeriodSeconds != nil {
		guest = *vmi.Spec.TerminationGracePeriodSeconds
	}
	return guest + PodGraceMarginSeconds
}

// LauncherPodPrefix starts the name of every launcher pod: the eviction webhook is called for
// pods so named only.
const LauncherPodPrefix = "launcher-"

// LauncherPodName is the name of a VMI's first launcher pod. It is fixed for the VMI (its UID is in
// it) so that a create repeated after a stale cache read fails with AlreadyExists instead of
// starting the guest twice.
func LauncherPodName(vmi *v1alpha1.VirtualMachineInstance) string {
	return podName(vmi.Name, string(vmi.UID))
}

func podName(vmiName, uid string) string {
	sum := sha256.Sum256([]byte(uid))
	if len(vmiName) > 40 {
		vmiName = vmiName[:40]
	}
	return LauncherPodPrefix + vmiName + "-" + hex.EncodeToString(sum[:])[:5]
}

// PodOptions are the cluster-wide settings of launcher pods.
type PodOptions struct {
	// Image is the launcher image.
	Image string
	// Acceleration is passed to the launcher: kvm, tcg or auto.
	Acceleration string
	// EvictionResponder declares lifeboat as the pods' EvictionRequest responder; only when the
	// API server serves lifecycle.k8s.io/v1alpha1 (it drops the field otherwise).
	EvictionResponder bool
}

// RefusedError is a VMI that may not have a launcher pod as it is: it names a node path the
// cluster admin does not allow. Retrying does not help until the VMI or the LifeboatConfig changes.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// NewLauncherPod builds the launcher pod of a VMI, owned by it. allowed are the node directories
// the cluster admin allows (LifeboatConfig spec.allowedNodeDirectories); a VMI naming a node path
// outside them gets no pod but a *RefusedError.
func NewLauncherPod(vmi *v1alpha1.VirtualMachineInstance, opts PodOptions, allowed []string) (*corev1.Pod, error) {
	if reason := v1alpha1.RefusedNodePath(vmi.Spec.Boot, allowed); reason != "" {
		return nil, &RefusedError{Reason: reason}
	}
	payload, err := json.Marshal(launcher.VMI{Namespace: vmi.Namespace, Name: vmi.Name, UID: string(vmi.UID), Spec: vmi.Spec, VolumeStatus: vmi.Status.VolumeStatus})
	if err != nil {
		return nil, fmt.Errorf("encoding the VMI for its launcher: %w", err)
	}
	grace := PodGracePeriodSeconds(vmi)
	// lifeboat's own key last: a VMI cannot send its pod to a node lifeboat does not run VMs on
	// (the API refuses the key too; this holds for VMIs stored before it did).
	nodeSelector := map[string]string{}
	for k, v := range vmi.Spec.NodeSelector {
		nodeSelector[k] = v
	}
	nodeSelector[v1alpha1.LabelKVMNode] = "true"
	cpus := vmi.Spec.CPUs
	if cpus == 0 {
		cpus = 1
	}
	memory := MemoryRequest(vmi.Spec.Memory, cpus)
	volumes, mounts, dirs := launcherVolumes(vmi, allowed)
	vmVols, vmMounts, vmDevices := vmVolumes(vmi)
	volumes, mounts = append(volumes, vmVols...), append(mounts, vmMounts...)
	allowedEnv, err := json.Marshal(dirs)
	if err != nil {
		return nil, err
	}
	var responders []corev1.EvictionResponder
	if opts.EvictionResponder {
		responders = []corev1.EvictionResponder{{Name: v1alpha1.EvictionResponderName, Priority: ptr.To(v1alpha1.EvictionResponderPriority)}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      LauncherPodName(vmi),
			Namespace: vmi.Namespace,
			Labels:    podLabels(vmi),
			// The descheduler's protocol (seed 003): evicting this pod only starts the VM's evacuation.
			Annotations:     map[string]string{v1alpha1.AnnotationRequestEvictOnly: ""},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			// libvirtd daemonizes QEMU, so QEMU's parent becomes the PID namespace's init. Sharing
			// the pod's namespace makes that the sandbox's pause process, which reaps it; with the
			// launcher as init, an exited QEMU stays a zombie that libvirt takes for alive, and a
			// stopped or migrated domain is not seen gone for tens of seconds.
			ShareProcessNamespace:         ptr.To(true),
			SecurityContext:               launcherPodSecurity(vmi),
			TerminationGracePeriodSeconds: ptr.To(grace),
			NodeSelector:                  nodeSelector,
			AutomountServiceAccountToken:  ptr.To(false),
			Containers: []corev1.Container{{
				Name:    launcher.ContainerName,
				Image:   opts.Image,
				Command: []string{launcher.Command},
				Args:    []string{"--acceleration=" + opts.Acceleration},
				Env: []corev1.EnvVar{
					{Name: launcher.EnvVMI, Value: string(payload)},
					{Name: launcher.EnvPodGracePeriod, Value: fmt.Sprint(grace)},
					{Name: launcher.EnvNodeDirectories, Value: string(allowedEnv)},
					fieldEnv("POD_NAME", "metadata.name"),
					fieldEnv("POD_NAMESPACE", "metadata.namespace"),
					fieldEnv("POD_UID", "metadata.uid"),
					fieldEnv("NODE_NAME", "spec.nodeName"),
				},
				Resources: withDevices(vmi, opts, corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceMemory: memory,
					corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(cpus)*CPURequestPerVCPUMilli, resource.DecimalSI),
				}}),
				VolumeMounts:  mounts,
				VolumeDevices: vmDevices,
				// A launcher that refuses its VMI (a boot file's symlink out of its directory) says
				// why in its last log line; the kubelet makes that the VMI's failure message.
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext:          launcherContainerSecurity(),
			}},
			Volumes:            volumes,
			EvictionResponders: responders,
			ReadinessGates:     readinessGates(vmi),
		},
	}, nil
}

// readinessGates makes the pod of a VM on the pod network Ready only while its guest runs in it
// (v1alpha1.PodConditionGuestRunning): a Service must not send connections to a migration
// target that has no guest yet, nor to a source the guest has left.
func readinessGates(vmi *v1alpha1.VirtualMachineInstance) []corev1.PodReadinessGate {
	if _, ok, _ := v1alpha1.PodInterface(&vmi.Spec); !ok {
		return nil
	}
	return []corev1.PodReadinessGate{{ConditionType: v1alpha1.PodConditionGuestRunning}}
}

// podLabels are the VMI's labels, so that a Service selecting the VM finds the pod it runs in
// (a migration target's too), and lifeboat's own, which a VMI's labels cannot set.
func podLabels(vmi *v1alpha1.VirtualMachineInstance) map[string]string {
	labels := map[string]string{}
	for k, v := range vmi.Labels {
		if !strings.HasPrefix(k, v1alpha1.GroupName+"/") {
			labels[k] = v
		}
	}
	labels[v1alpha1.LabelRole] = v1alpha1.RoleLauncher
	labels[v1alpha1.LabelVMIName] = vmi.Name
	labels[v1alpha1.LabelVMIUID] = string(vmi.UID)
	return labels
}

// launcherPodSecurity runs the launcher pod as the launcher's own user, never root, so that
// Pod Security "restricted" admits it: the pod's libvirtd is a session daemon of that user
// (domain.daemonLayout), and QEMU runs as that user too. fsGroup makes the pod's volumes
// (its emptyDirs, its claims where the volume plugin supports ownership) the user's group's.
func launcherPodSecurity(vmi *v1alpha1.VirtualMachineInstance) *corev1.PodSecurityContext {
	sc := &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To[int64](launcher.UID),
		RunAsGroup:     ptr.To[int64](launcher.GID),
		FSGroup:        ptr.To[int64](launcher.GID),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	// The launcher serves its guest DHCP on port 67 without a capability; the sysctl is one of
	// the pod's own that Pod Security "restricted" allows.
	if _, ok, _ := v1alpha1.PodInterface(&vmi.Spec); ok {
		sc.Sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: fmt.Sprint(launcher.DHCPPort)}}
	}
	return sc
}

// launcherContainerSecurity gives the launcher no capability and no way to gain one: QEMU under
// a session libvirtd needs none, and its devices come from the device plugins with permissions
// the runtime sets for the container (/dev/kvm is open to all users on common distributions).
func launcherContainerSecurity() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// withDevices adds the devices the launcher needs, from the agents' device plugins, to r: with
// KVM asked for outright, /dev/kvm, so that the scheduler places the VM only where a node's agent
// found KVM (with "auto" the launcher decides on the node, so nothing can be asked for), and for a
// card on the pod network, /dev/net/tun.
func withDevices(vmi *v1alpha1.VirtualMachineInstance, opts PodOptions, r corev1.ResourceRequirements) corev1.ResourceRequirements {
	var devices []string
	if opts.Acceleration == "kvm" {
		devices = append(devices, v1alpha1.DeviceKVM)
	}
	// The tap's queue is opened through /dev/net/tun, which a container has only from the device plugin.
	if _, ok, _ := v1alpha1.PodInterface(&vmi.Spec); ok {
		devices = append(devices, v1alpha1.DeviceTun)
	}
	return addDevices(r, devices...)
}

// addDevices asks for one of each device, as requests and limits (extended resources must be both).
func addDevices(r corev1.ResourceRequirements, devices ...string) corev1.ResourceRequirements {
	if len(devices) == 0 {
		return r
	}
	one := resource.MustParse("1")
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	if r.Limits == nil {
		r.Limits = corev1.ResourceList{}
	}
	for _, d := range devices {
		r.Requests[corev1.ResourceName(d)] = one
		r.Limits[corev1.ResourceName(d)] = one
	}
	return r
}

// NewTargetPod builds the launcher pod that receives a VMI in a migration: the VMI's launcher pod,
// named for the migration, told to wait for the guest, and kept off the source node and off nodes
// whose agents find them short of memory (LabelMemoryPressureRelief). With postCopy it also asks
// for a userfaultfd, which its QEMU needs to receive the guest in post-copy (see PostCopyTarget).
func NewTargetPod(vmi *v1alpha1.VirtualMachineInstance, m *v1alpha1.VirtualMachineInstanceMigration, opts PodOptions, allowed []string, postCopy bool) (*corev1.Pod, error) {
	pod, err := NewLauncherPod(vmi, opts, allowed)
	if err != nil {
		return nil, err
	}
	pod.Name = TargetPodName(vmi, m)
	pod.Labels[launcher.LabelMigrationUID] = string(m.UID)
	c := &pod.Spec.Containers[0]
	if postCopy {
		c.Resources = addDevices(c.Resources, v1alpha1.DeviceUserFaultFD)
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: launcher.EnvMigrationTarget, Value: string(m.UID)})
	pod.Spec.Affinity = targetAffinity(vmi)
	preferOtherNodes(pod.Spec.Affinity, m.Annotations[v1alpha1.AnnotationPreferOtherNodes])
	return pod, nil
}

// preferOtherNodes makes the scheduler prefer nodes other than those named (comma-separated):
// where the same evacuation's earlier attempts failed, such as one whose agent was killed
// mid-migration and may not be back yet. A preference, so that a VM with no other node to go to
// still gets a target.
func preferOtherNodes(a *corev1.Affinity, names string) {
	na := a.NodeAffinity
	for n := range strings.SplitSeq(names, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		// A field selector takes one value (the API server's validation): a term per node, so
		// a node none names scores the most.
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.PreferredSchedulingTerm{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpNotIn, Values: []string{n}},
			}}})
	}
}

// targetAffinity keeps a target pod off the VMI's node and off nodes short of memory.
func targetAffinity(vmi *v1alpha1.VirtualMachineInstance) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{vmi.Status.NodeName}},
				{Key: v1alpha1.LabelMemoryPressureRelief, Operator: corev1.NodeSelectorOpDoesNotExist},
			},
		}}},
	}}
}

// KeepOff keeps a target pod (NewTargetPod) off nodes besides the VMI's own: nodes where an
// earlier target of the VM never became ready, or whose kubelets stopped renewing their
// Leases, which the scheduler, seeing them Ready, would otherwise pick. By name, which every
// node has, whatever its labels: one requirement per node, as the API server takes a node field
// selector with one value only.
func KeepOff(pod *corev1.Pod, nodes []string) {
	if len(nodes) == 0 || pod.Spec.Affinity == nil || pod.Spec.Affinity.NodeAffinity == nil ||
		pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return
	}
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		for _, node := range nodes {
			terms[i].MatchFields = append(terms[i].MatchFields, corev1.NodeSelectorRequirement{
				Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpNotIn, Values: []string{node}})
		}
	}
}

// TargetPlacement is what of a VMI's target pod (NewTargetPod) the scheduler places it by, without
// the rest of the pod, which needs the cluster's settings: its node selector, its node affinity,
// its tolerations (none) and its memory request. Devices (/dev/kvm, /dev/net/tun, userfaultfd)
// are left out: the scheduler checks them against the agents' device plugins, and a placement
// that leaves them out errs towards trying a migration, never towards giving one up.
func TargetPlacement(vmi *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	nodeSelector := map[string]string{}
	for k, v := range vmi.Spec.NodeSelector {
		nodeSelector[k] = v
	}
	nodeSelector[v1alpha1.LabelKVMNode] = "true"
	cpus := vmi.Spec.CPUs
	if cpus == 0 {
		cpus = 1
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: vmi.Name, Namespace: vmi.Namespace},
		Spec: corev1.PodSpec{
			NodeSelector: nodeSelector,
			Affinity:     targetAffinity(vmi),
			Containers: []corev1.Container{{Name: launcher.ContainerName, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceMemory: MemoryRequest(vmi.Spec.Memory, cpus),
			}}}},
		},
	}
}

// TargetPodName is fixed for a migration, so a repeated create fails with AlreadyExists.
func TargetPodName(vmi *v1alpha1.VirtualMachineInstance, m *v1alpha1.VirtualMachineInstanceMigration) string {
	return podName(vmi.Name, string(m.UID))
}

// ActivePod is the pod that runs the VMI's guest: once the VMI has a node, the unfinished pod
// on that node (after a migration, the former target); before, its first launcher pod. pods are
// the pods the VMI controls.
func ActivePod(vmi *v1alpha1.VirtualMachineInstance, pods []*corev1.Pod) *corev1.Pod {
	var finished *corev1.Pod
	for _, p := range pods {
		switch {
		case vmi.Status.NodeName == "" && p.Name == LauncherPodName(vmi):
			return p
		case vmi.Status.NodeName == "" || p.Spec.NodeName != vmi.Status.NodeName:
		case PodEnded(p):
			finished = p // the VMI's last pod, unless a live one is there too
		default:
			return p
		}
	}
	return finished
}

// PodEnded reports whether the pod reached a terminal phase: its containers run no more and it no
// longer counts against its node.
func PodEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

// launcherVolumes mounts the launcher's run volume, an emptyDir at the launcher's directory
// (api/launcher PodRunDir; the agent reaches it through the kubelet's pod directory), and, at the same paths,
// the allowed node directories that hold the guest's boot files: read-only, but for a disk
// image's. Those are the only node paths a launcher pod ever mounts, and only when the cluster
// admin allowed them (such a pod is not "restricted"). It returns the directories mounted,
// which the launcher checks the files' symlinks against. The VMI's paths were checked against
// allowed already.
func launcherVolumes(vmi *v1alpha1.VirtualMachineInstance, allowed []string) ([]corev1.Volume, []corev1.VolumeMount, []string) {
	volumes := []corev1.Volume{{Name: launcher.RunVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(runVolumeSizeLimit)}}}}
	mounts := []corev1.VolumeMount{{Name: launcher.RunVolume, MountPath: launcher.PodRunDir}}
	dirs := map[string]bool{} // directory → read-only
	for _, f := range v1alpha1.NodePaths(vmi.Spec.Boot) {
		d, _ := v1alpha1.AllowedDirectory(f.Path, allowed)
		readOnly, seen := dirs[d]
		dirs[d] = (readOnly || !seen) && f.Path != vmi.Spec.Boot.Disk
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		if !coveredBy(d, dirs) {
			sorted = append(sorted, d)
		}
	}
	sort.Strings(sorted)
	for i, d := range sorted {
		name := fmt.Sprintf("node-dir-%d", i)
		volumes = append(volumes, corev1.Volume{
			Name:         name,
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: d, Type: ptr.To(corev1.HostPathDirectory)}},
		})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: d, ReadOnly: dirs[d]})
	}
	return volumes, mounts, sorted
}

// coveredBy reports whether another directory of dirs holds d and is mounted as d would be, so
// that mounting d as well would only nest the same files.
func coveredBy(d string, dirs map[string]bool) bool {
	for outer, readOnly := range dirs {
		if strings.HasPrefix(d, outer+"/") && readOnly == dirs[d] {
			return true
		}
	}
	return false
}

// vmVolumes are the VM's own volumes in its pod: the images of its kernel and containerDisks as
// image volumes (the kubelet pulls them as it pulls container images, and mounts them read-only),
// its claims (a Block-mode claim, as the VMI's status records it, as a device), the Secrets of its
// cloud-init user data, and an emptyDir for the disks the launcher writes. None of them is a node path.
func vmVolumes(vmi *v1alpha1.VirtualMachineInstance) ([]corev1.Volume, []corev1.VolumeMount, []corev1.VolumeDevice) {
	var devices []corev1.VolumeDevice
	volumes := []corev1.Volume{{Name: "vm-state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mounts := []corev1.VolumeMount{{Name: "vm-state", MountPath: launcher.StateDir}}
	image := func(name, reference string, policy corev1.PullPolicy, at string) {
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			Image: &corev1.ImageVolumeSource{Reference: reference, PullPolicy: policy},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: at, ReadOnly: true})
	}
	if c := vmi.Spec.Boot.Container; c != nil {
		image("kernel-boot", c.Image, c.ImagePullPolicy, launcher.KernelBootDir)
	}
	for _, v := range vmi.Spec.Volumes {
		switch {
		case v.ContainerDisk != nil:
			image(PodVolumePrefix+v.Name, v.ContainerDisk.Image, v.ContainerDisk.ImagePullPolicy, path.Join(launcher.ContainerDisksDir, v.Name))
		case v.PersistentVolumeClaim != nil:
			volumes = append(volumes, corev1.Volume{Name: PodVolumePrefix + v.Name, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.PersistentVolumeClaim.ClaimName},
			}})
			if v1alpha1.BlockClaim(vmi.Status.VolumeStatus, v.Name) {
				devices = append(devices, corev1.VolumeDevice{Name: PodVolumePrefix + v.Name, DevicePath: path.Join(launcher.ClaimDevicesDir, v.Name)})
				continue
			}
			mounts = append(mounts, corev1.VolumeMount{Name: PodVolumePrefix + v.Name, MountPath: path.Join(launcher.ClaimsDir, v.Name)})
		case v.CloudInitNoCloud != nil && v.CloudInitNoCloud.UserDataSecretRef != nil:
			volumes = append(volumes, corev1.Volume{Name: PodVolumePrefix + v.Name, VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: v.CloudInitNoCloud.UserDataSecretRef.Name},
			}})
			mounts = append(mounts, corev1.VolumeMount{Name: PodVolumePrefix + v.Name, MountPath: path.Join(launcher.SecretsDir, v.Name), ReadOnly: true})
		}
	}
	return volumes, mounts, devices
}

// runVolumeSizeLimit bounds the run volume on the node's disk: its sockets, its libvirtd's files
// and the guest's console log, which the launcher empties past 16 MiB, hold a few MiB. Past the
// limit the kubelet evicts the pod, so that a guest whose output outruns the launcher cannot
// fill the node's disk (issue 45, N13). The VM state volume has none: it holds the overlays
// the guest writes its containerDisks to, which may grow to the disks' size, unknown until the
// images are pulled.
var runVolumeSizeLimit = resource.MustParse("256Mi")

// PodVolumePrefix names a VMI volume's volume in the launcher pod, apart from lifeboat's own.
const PodVolumePrefix = "vol-"
