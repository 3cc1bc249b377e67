package vmi

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestNewLauncherPod(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 2, Memory: resource.MustParse("1Gi"),
			Boot:                          v1alpha1.BootSource{Kernel: "/images/vmlinuz", Initrd: "/images/initrd.gz", Disk: "/disks/vm1.qcow2"},
			TerminationGracePeriodSeconds: ptr.To[int64](60),
			NodeSelector:                  map[string]string{"zone": "a"},
		},
	}
	allowed := []string{"/disks", "/images", "/unused"}
	pod, err := NewLauncherPod(vmi, PodOptions{Image: "lifeboat-launcher:dev", Acceleration: "tcg"}, allowed)
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(pod); ref == nil || ref.UID != vmi.UID || ref.Kind != "VirtualMachineInstance" {
		t.Errorf("controller reference = %+v, want the VMI", ref)
	}
	if pod.Labels[v1alpha1.LabelVMIName] != "vm1" || pod.Labels[v1alpha1.LabelVMIUID] != "0a1b" || pod.Labels[v1alpha1.LabelRole] != v1alpha1.RoleLauncher {
		t.Errorf("labels = %v", pod.Labels)
	}
	if v, ok := pod.Annotations[v1alpha1.AnnotationRequestEvictOnly]; !ok || v != "" {
		t.Errorf("annotations = %v, want the descheduler's %s with an empty value", pod.Annotations, v1alpha1.AnnotationRequestEvictOnly)
	}
	if pod.Spec.NodeSelector[v1alpha1.LabelKVMNode] != "true" || pod.Spec.NodeSelector["zone"] != "a" {
		t.Errorf("node selector = %v, want the KVM label and the VMI's own", pod.Spec.NodeSelector)
	}
	if *pod.Spec.TerminationGracePeriodSeconds != 60+PodGraceMarginSeconds {
		t.Errorf("pod grace = %d, want the VMI's 60 + %d", *pod.Spec.TerminationGracePeriodSeconds, PodGraceMarginSeconds)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restart policy = %s: a launcher must never be restarted under a running guest", pod.Spec.RestartPolicy)
	}
	c := pod.Spec.Containers[0]
	// 1 GiB of guest, 172 MiB fixed, 8 MiB for each of 2 vCPUs, 2 MiB of page tables per GiB.
	wantMem := resource.MustParse("1214Mi")
	if got := c.Resources.Requests[corev1.ResourceMemory]; got.Cmp(wantMem) != 0 {
		t.Errorf("memory request = %s, want %s (guest + 172Mi + 8Mi per vCPU + guest/512)", got.String(), wantMem.String())
	}
	if got := c.Resources.Requests[corev1.ResourceCPU]; got.MilliValue() != 200 {
		t.Errorf("cpu request = %s, want 200m for 2 vCPUs", got.String())
	}
	var payload launcher.VMI
	var dirs []string
	for _, e := range c.Env {
		switch e.Name {
		case launcher.EnvVMI:
			if err := json.Unmarshal([]byte(e.Value), &payload); err != nil {
				t.Fatal(err)
			}
		case launcher.EnvNodeDirectories:
			if err := json.Unmarshal([]byte(e.Value), &dirs); err != nil {
				t.Fatal(err)
			}
		}
	}
	if want := []string{"/disks", "/images"}; !slices.Equal(dirs, want) {
		t.Errorf("the launcher is told the node directories %v, want the mounted %v", dirs, want)
	}
	if payload.UID != "0a1b" || payload.Spec.Boot.Kernel != "/images/vmlinuz" {
		t.Errorf("launcher payload = %+v", payload)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.ReadOnly
	}
	if ro, ok := mounts["/images"]; !ok || !ro {
		t.Errorf("boot image directory must be mounted read-only: %v", mounts)
	}
	if ro, ok := mounts["/disks"]; !ok || ro {
		t.Errorf("disk image directory must be mounted read-write: %v", mounts)
	}
	if _, ok := mounts["/unused"]; ok || len(mounts) != 4 {
		t.Errorf("only the allowed directories the VMI uses, the run directory and the VM's own emptyDir may be mounted: %v", mounts)
	}
	if ro, ok := mounts[launcher.PodRunDir]; !ok || ro {
		t.Errorf("the run volume must be mounted read-write at the launcher's directory %s: %v", launcher.PodRunDir, mounts)
	}
	if p := pod.Spec.ShareProcessNamespace; p == nil || !*p {
		t.Errorf("a launcher pod shares its PID namespace, so that the pause process reaps QEMU")
	}
	if pod.Spec.HostNetwork {
		t.Errorf("a launcher pod never uses its node's network")
	}
}

func TestNestedAllowedDirectoriesAreMountedOnce(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse("1Gi"),
			Boot: v1alpha1.BootSource{Kernel: "/guest/linux/vmlinuz", Initrd: "/guest/initrd.gz", Disk: "/guest/linux/disks/a.raw"}},
	}
	pod, err := NewLauncherPod(vmi, PodOptions{Image: "img", Acceleration: "tcg"}, []string{"/guest", "/guest/linux", "/guest/linux/disks"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		got[m.MountPath] = m.ReadOnly
	}
	want := map[string]bool{launcher.PodRunDir: false, launcher.StateDir: false, "/guest": true, "/guest/linux/disks": false}
	if !maps.Equal(got, want) {
		t.Errorf("mounts (path: read-only) %v, want %v: a read-only directory inside a read-only one is not mounted again, a writable one is", got, want)
	}
}

func TestNoLauncherPodForANodePathNotAllowed(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse("1Gi"),
			Boot: v1alpha1.BootSource{Kernel: "/var/lib/lifeboat/guest/vmlinuz", Disk: "/dev/sda"}},
	}
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "m1"}}
	allowed := []string{"/var/lib/lifeboat/guest"}
	opts := PodOptions{Image: "img", Acceleration: "tcg"}
	pod, err := NewLauncherPod(vmi, opts, allowed)
	var refused *RefusedError
	if pod != nil || !errors.As(err, &refused) || !strings.Contains(refused.Reason, `boot.disk "/dev/sda"`) {
		t.Errorf("a VMI with the node's /dev/sda as a disk got pod %v and error %v; want no pod and a refusal naming boot.disk", pod, err)
	}
	if pod, err := NewTargetPod(vmi, m, opts, allowed, false); pod != nil || !errors.As(err, &refused) {
		t.Errorf("a migration target of that VMI got pod %v and error %v; want no pod and a refusal", pod, err)
	}
}

func TestLauncherPodNameIsStableAndShort(t *testing.T) {
	a := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "a-very-long-virtual-machine-name-that-goes-on-and-on-and-on", UID: "u1"}}
	b := a.DeepCopy()
	b.UID = "u2"
	if LauncherPodName(a) != LauncherPodName(a.DeepCopy()) {
		t.Error("the name must be the same for the same VMI")
	}
	if LauncherPodName(a) == LauncherPodName(b) {
		t.Error("a VMI re-created with the same name must get a new pod name")
	}
	if n := len(LauncherPodName(a)); n > 63 {
		t.Errorf("name is %d characters; keep it a valid hostname label", n)
	}
}

func TestActivePod(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", UID: "u1"}}
	first := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: LauncherPodName(vmi)}, Spec: corev1.PodSpec{NodeName: "a"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-vm-target"}, Spec: corev1.PodSpec{NodeName: "b"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	sourceDone := first.DeepCopy()
	sourceDone.Status.Phase = corev1.PodSucceeded
	back := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-vm-back"}, Spec: corev1.PodSpec{NodeName: "a"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	cases := []struct {
		name string
		node string
		pods []*corev1.Pod
		want *corev1.Pod
	}{
		{"before scheduling: the first launcher pod", "", []*corev1.Pod{first}, first},
		{"running on a: the pod on a, not the migration target on b", "a", []*corev1.Pod{first, target}, first},
		{"migrated to b: the former target", "b", []*corev1.Pod{sourceDone, target}, target},
		{"migrated back to a: the live pod, not the finished one", "a", []*corev1.Pod{sourceDone, target, back}, back},
		{"the guest ended: its finished pod", "a", []*corev1.Pod{sourceDone}, sourceDone},
		{"no pod on the VMI's node", "c", []*corev1.Pod{first, target}, nil},
	}
	for _, tc := range cases {
		v := vmi.DeepCopy()
		v.Status.NodeName = tc.node
		if got := ActivePod(v, tc.pods); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, podNameOf(got), podNameOf(tc.want))
		}
	}
}

func podNameOf(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	return p.Name
}

func TestLauncherPodDeclaresTheEvictionResponderOnlyWhenServed(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "m1"}}
	want := []corev1.EvictionResponder{{Name: "lifeboat.dev/evacuation", Priority: ptr.To[int32](10000)}}
	cases := []struct {
		name   string
		served bool
		want   []corev1.EvictionResponder
	}{
		{"lifecycle.k8s.io/v1alpha1 served: lifeboat responds at the managing controller's priority", true, want},
		{"not served: the field is left out", false, nil},
	}
	for _, tc := range cases {
		opts := PodOptions{Image: "img", Acceleration: "tcg", EvictionResponder: tc.served}
		first, err := NewLauncherPod(vmi, opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		target, err := NewTargetPod(vmi, m, opts, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range []*corev1.Pod{first, target} {
			if !apiequality.Semantic.DeepEqual(pod.Spec.EvictionResponders, tc.want) {
				t.Errorf("%s: pod %s evictionResponders = %+v, want %+v", tc.name, pod.Name, pod.Spec.EvictionResponders, tc.want)
			}
		}
	}
}

// A launcher told to use KVM asks for /dev/kvm from the agents' device plugin, so the scheduler
// places it only where an agent found KVM; with TCG or auto it asks for nothing.
func TestLauncherPodAsksForKVMOnlyWhenItMustUseIt(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	for _, tc := range []struct {
		acceleration string
		want         bool
	}{{"kvm", true}, {"tcg", false}, {"auto", false}} {
		pod, err := NewLauncherPod(vmi, PodOptions{Image: "img", Acceleration: tc.acceleration}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := pod.Spec.Containers[0].Resources
		req, inRequests := r.Requests[v1alpha1.DeviceKVM]
		limit, inLimits := r.Limits[v1alpha1.DeviceKVM]
		got := inRequests && inLimits && req.Value() == 1 && limit.Value() == 1
		if got != tc.want || (!tc.want && (inRequests || inLimits)) {
			t.Errorf("acceleration %s: %s requests %v limits %v, want asked for: %v", tc.acceleration, v1alpha1.DeviceKVM, r.Requests, r.Limits, tc.want)
		}
	}
}

// A target pod asks for a userfaultfd only when the migration may go post-copy; a source pod never does.
func TestOnlyAPostCopyTargetAsksForAUserfaultfd(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "m1"}}
	opts := PodOptions{Image: "img", Acceleration: "kvm"}
	source, err := NewLauncherPod(vmi, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pod  func() (*corev1.Pod, error)
		what string
		want bool
	}{
		{func() (*corev1.Pod, error) { return source, nil }, "source", false},
		{func() (*corev1.Pod, error) { return NewTargetPod(vmi, m, opts, nil, false) }, "target without post-copy", false},
		{func() (*corev1.Pod, error) { return NewTargetPod(vmi, m, opts, nil, true) }, "post-copy target", true},
	} {
		pod, err := tc.pod()
		if err != nil {
			t.Fatal(err)
		}
		r := pod.Spec.Containers[0].Resources
		req, inRequests := r.Requests[v1alpha1.DeviceUserFaultFD]
		limit, inLimits := r.Limits[v1alpha1.DeviceUserFaultFD]
		if got := inRequests && inLimits && req.Value() == 1 && limit.Value() == 1; got != tc.want || (!tc.want && (inRequests || inLimits)) {
			t.Errorf("%s: %s requests %v limits %v, want asked for: %v", tc.what, v1alpha1.DeviceUserFaultFD, r.Requests, r.Limits, tc.want)
		}
		// The KVM device stays asked for beside it.
		if _, ok := r.Limits[v1alpha1.DeviceKVM]; !ok {
			t.Errorf("%s: %s no longer asked for: %v", tc.what, v1alpha1.DeviceKVM, r.Limits)
		}
	}
}

// A VMI's node selector adds to lifeboat's, never replaces it: its pod goes only to nodes lifeboat
// runs VMs on, even for a VMI stored before the API refused the key.
func TestAVMINodeSelectorCannotReplaceLifeboats(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	vmi.Spec.NodeSelector = map[string]string{v1alpha1.LabelKVMNode: "false", "zone": "a"}
	pod, err := NewLauncherPod(vmi, PodOptions{Image: "img", Acceleration: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Spec.NodeSelector; got[v1alpha1.LabelKVMNode] != "true" || got["zone"] != "a" {
		t.Errorf("node selector %v: want lifeboat.dev/kvm=true and the VMI's zone=a", got)
	}
}

// A VM of images mounts them as image volumes, read-only, and an emptyDir for what the launcher
// writes; nothing of the node but lifeboat's run directory.
func TestLauncherPodMountsImagesNotNodePaths(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Memory: resource.MustParse("1Gi"),
			Boot:   v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", ImagePullPolicy: corev1.PullIfNotPresent, KernelPath: "/vmlinuz"}},
			Disks:  []v1alpha1.Disk{{Name: "root"}, {Name: "seed"}},
			Volumes: []v1alpha1.Volume{
				{Name: "root", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.org/disk:1"}},
				{Name: "seed", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config"}},
			},
		},
	}
	pod, err := NewLauncherPod(vmi, PodOptions{Image: "lifeboat-launcher:dev", Acceleration: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
		if v.HostPath != nil {
			t.Errorf("volume %s is node path %s", v.Name, v.HostPath.Path)
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.Name] = m
	}
	for name, want := range map[string]struct {
		image, at string
		policy    corev1.PullPolicy
	}{
		"kernel-boot": {"example.org/kernel:1", launcher.KernelBootDir, corev1.PullIfNotPresent},
		"vol-root":    {"example.org/disk:1", launcher.ContainerDisksDir + "/root", ""},
	} {
		v, m := volumes[name], mounts[name]
		if v.Image == nil || v.Image.Reference != want.image || v.Image.PullPolicy != want.policy {
			t.Errorf("volume %s = %+v, want image volume %s (pull policy %q)", name, v, want.image, want.policy)
		}
		if m.MountPath != want.at || !m.ReadOnly {
			t.Errorf("mount of %s = %+v, want it read-only at %s", name, m, want.at)
		}
	}
	if v, m := volumes["vm-state"], mounts["vm-state"]; v.EmptyDir == nil || m.MountPath != launcher.StateDir || m.ReadOnly {
		t.Errorf("vm-state = %+v mounted %+v, want a writable emptyDir at %s", v, m, launcher.StateDir)
	}
	if _, ok := volumes["vol-seed"]; ok {
		t.Error("the cloud-init seed has a pod volume; the launcher writes it into vm-state")
	}

	vmi.Spec.Volumes[1].CloudInitNoCloud = &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "seed-secret"}}
	pod, err = NewLauncherPod(vmi, PodOptions{Image: "lifeboat-launcher:dev", Acceleration: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "vol-seed" })
	j := slices.IndexFunc(pod.Spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "vol-seed" })
	if i < 0 || j < 0 || pod.Spec.Volumes[i].Secret == nil || pod.Spec.Volumes[i].Secret.SecretName != "seed-secret" ||
		!pod.Spec.Containers[0].VolumeMounts[j].ReadOnly || pod.Spec.Containers[0].VolumeMounts[j].MountPath != launcher.SecretsDir+"/seed" {
		t.Errorf("user data from a Secret: want the Secret mounted read-only at %s/seed; volumes %+v", launcher.SecretsDir, pod.Spec.Volumes)
	}
}

func TestClaimStatuses(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	claims := map[string]*corev1.PersistentVolumeClaim{
		"shared": {Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}}},
		"bound": {Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany, corev1.ReadWriteOnce}},
			Status: corev1.PersistentVolumeClaimStatus{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		"raw": {Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: &block}},
	}
	get := func(name string) (*corev1.PersistentVolumeClaim, error) {
		if c, ok := claims[name]; ok {
			return c, nil
		}
		return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
	}
	withClaims := func(names ...string) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}}
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "seed", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "x"}})
		for _, n := range names {
			v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "v-" + n, PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: n}})
		}
		return v
	}

	got, err := ClaimStatuses(withClaims("shared", "bound"), get)
	if err != nil || len(got) != 2 {
		t.Fatalf("ClaimStatuses = %+v, %v; want the two claims' records", got, err)
	}
	if _, rwx := v1alpha1.ReadWriteMany(got, "v-shared"); !rwx {
		t.Errorf("an unbound claim asking for ReadWriteMany: %+v, want it recorded as such", got[0])
	}
	if _, rwx := v1alpha1.ReadWriteMany(got, "v-bound"); rwx || got[1].PersistentVolumeClaimInfo.Capacity.Storage().String() != "1Gi" {
		t.Errorf("a bound claim: %+v, want the bound access modes (ReadWriteOnce) and capacity", got[1])
	}
	var claimErr *ClaimError
	if _, err := ClaimStatuses(withClaims("missing"), get); !errors.As(err, &claimErr) || claimErr.Reason != ReasonClaimNotFound ||
		!strings.Contains(err.Error(), `persistentVolumeClaim "missing" does not exist in namespace ns`) {
		t.Errorf("a missing claim: %v, want %s naming it", err, ReasonClaimNotFound)
	}
	raw, err := ClaimStatuses(withClaims("raw"), get)
	if err != nil || !v1alpha1.BlockClaim(raw, "v-raw") || v1alpha1.BlockClaim(got, "v-bound") {
		t.Errorf("a Block claim: %+v, %v; want it recorded as Block, and only it", raw, err)
	}
}

// TestABlockClaimIsADeviceOfThePod: a Block-mode claim reaches the launcher as a device (the
// claim is the disk), a file-system claim as a mount holding disk.img.
func TestABlockClaimIsADeviceOfThePod(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Memory: resource.MustParse("256Mi"),
			Boot:   v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"}},
			Disks:  []v1alpha1.Disk{{Name: "raw"}, {Name: "files"}},
			Volumes: []v1alpha1.Volume{
				{Name: "raw", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "c-raw"}},
				{Name: "files", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "c-files"}},
			},
		},
		Status: v1alpha1.VirtualMachineInstanceStatus{VolumeStatus: []v1alpha1.VolumeStatus{
			{Name: "raw", PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{ClaimName: "c-raw", VolumeMode: &block}},
			{Name: "files", PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{ClaimName: "c-files"}},
		}},
	}
	pod, err := NewLauncherPod(vmi, PodOptions{Image: "launcher", Acceleration: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	want := []corev1.VolumeDevice{{Name: PodVolumePrefix + "raw", DevicePath: launcher.ClaimDevicesDir + "/raw"}}
	if !reflect.DeepEqual(c.VolumeDevices, want) {
		t.Errorf("volumeDevices = %+v, want %+v", c.VolumeDevices, want)
	}
	for _, m := range c.VolumeMounts {
		if m.Name == PodVolumePrefix+"raw" {
			t.Errorf("the Block claim is also mounted: %+v", m)
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == PodVolumePrefix+"files" && m.MountPath == launcher.ClaimsDir+"/files"
	}) {
		t.Errorf("the file-system claim is not mounted at %s/files: %+v", launcher.ClaimsDir, c.VolumeMounts)
	}
}

// TestLauncherPodsAreRestricted evaluates the pods the VMI controller builds with the Pod
// Security admission's own checks at the "restricted" level: a VM of images, claims and
// cloud-init, and a migration target. The API server's admission is tested end to end in
// test/e2e (TestRestrictedLaunchersRunMoveAndReachOnlyTheirOwnSockets).
func TestLauncherPodsAreRestricted(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Memory: resource.MustParse("256Mi"),
			Boot:   v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"}},
			Disks:  []v1alpha1.Disk{{Name: "root"}, {Name: "data"}, {Name: "seed"}},
			Volumes: []v1alpha1.Volume{
				{Name: "root", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.org/disk:1"}},
				{Name: "data", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "data"}},
				{Name: "seed", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "seed"}}},
			},
			Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}},
			Networks:   []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}},
		},
		Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: "node-1"},
	}
	opts := PodOptions{Image: "lifeboat-launcher:dev", Acceleration: "kvm"}
	source, err := NewLauncherPod(vmi, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A target that may receive the guest in post-copy asks for a userfaultfd and stays restricted.
	target, err := NewTargetPod(vmi, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "9f"}}, opts, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	restricted := api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}
	for _, pod := range []*corev1.Pod{source, target} {
		for _, r := range evaluator.EvaluatePod(restricted, &pod.ObjectMeta, &pod.Spec) {
			if !r.Allowed {
				t.Errorf("pod %s is not restricted: %s: %s", pod.Name, r.ForbiddenReason, r.ForbiddenDetail)
			}
		}
		sc, c := pod.Spec.SecurityContext, pod.Spec.Containers[0]
		// The guest's DHCP server binds port 67 as the launcher's user.
		if want := []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "67"}}; sc == nil || !reflect.DeepEqual(sc.Sysctls, want) {
			t.Errorf("pod %s: security %+v, want sysctls %+v", pod.Name, sc, want)
		}
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 || c.SecurityContext == nil || c.SecurityContext.Privileged != nil ||
			pod.Spec.HostPID || pod.Spec.HostNetwork || pod.Spec.HostIPC {
			t.Errorf("pod %s: security %+v, container %+v: want a non-root user, nothing privileged, no host namespaces", pod.Name, sc, c.SecurityContext)
		}
		for _, v := range pod.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("pod %s mounts node path %s", pod.Name, v.HostPath.Path)
			}
		}
	}
}

func TestGuestRunningIn(t *testing.T) {
	vmi := func(phase v1alpha1.VirtualMachineInstancePhase, node string) *v1alpha1.VirtualMachineInstance {
		return &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: phase, NodeName: node}}
	}
	pod := func(node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	for _, tc := range []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		pod  *corev1.Pod
		want corev1.ConditionStatus
	}{
		{"the guest runs on the pod's node", vmi(v1alpha1.VMIRunning, "a"), pod("a", corev1.PodRunning), corev1.ConditionTrue},
		{"a migration target before the guest arrived", vmi(v1alpha1.VMIRunning, "a"), pod("b", corev1.PodRunning), corev1.ConditionFalse},
		{"a guest still starting", vmi(v1alpha1.VMIScheduled, "a"), pod("a", corev1.PodRunning), corev1.ConditionFalse},
		{"a source pod whose launcher exited after the migration", vmi(v1alpha1.VMIRunning, "a"), pod("a", corev1.PodSucceeded), corev1.ConditionFalse},
		{"an unscheduled pod", vmi(v1alpha1.VMIRunning, ""), pod("", corev1.PodPending), corev1.ConditionFalse},
		{"a stopped VM", vmi(v1alpha1.VMISucceeded, "a"), pod("a", corev1.PodRunning), corev1.ConditionFalse},
	} {
		if got := GuestRunningIn(tc.vmi, tc.pod); got != tc.want {
			t.Errorf("%s: GuestRunningIn = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A migration's target pod goes neither to the VM's node nor to a node that node-pressure relief
// finds short of memory.
func TestTheTargetPodAvoidsTheSourceAndNodesUnderRelief(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	vmi.Status.NodeName = "source"
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "m1"}}
	pod, err := NewTargetPod(vmi, m, PodOptions{Image: "img", Acceleration: "tcg"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"source"}},
		{Key: v1alpha1.LabelMemoryPressureRelief, Operator: corev1.NodeSelectorOpDoesNotExist},
	}}}}
	if a := pod.Spec.Affinity; a == nil || a.NodeAffinity == nil || !apiequality.Semantic.DeepEqual(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution, want) {
		t.Errorf("target pod affinity %+v, want required %+v", pod.Spec.Affinity, want)
	}
}

// A guest that floods its console cannot fill the node's disk through the run volume, where the
// console log is: the kubelet holds it to runVolumeSizeLimit.
func TestTheRunVolumeIsBounded(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "0a1b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"),
			Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"}}}}
	pod, err := NewLauncherPod(vmi, PodOptions{Image: "lifeboat-launcher:dev", Acceleration: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name != launcher.RunVolume {
			continue
		}
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(resource.MustParse("256Mi")) != 0 {
			t.Errorf("the run volume is %+v, want an emptyDir limited to 256Mi", v.VolumeSource)
		}
		return
	}
	t.Errorf("the launcher pod has no run volume: %+v", pod.Spec.Volumes)
}

// A retry's target prefers nodes other than where the evacuation's earlier attempts failed (its
// migration's AnnotationPreferOtherNodes), as the scheduler scores them, and still admits them.
func TestATargetPrefersNodesWhereItsEvacuationHadNotFailed(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	vmi.Status.NodeName = "node-2"
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	}
	for _, tc := range []struct {
		name       string
		annotation string
		want       map[string]int64 // the scheduler's preference score by node
	}{
		{"a first attempt prefers none", "", map[string]int64{"node-1": 0, "node-3": 0}},
		{"seed 10's soak-0: the first target's agent was killed on node-1", "node-1", map[string]int64{"node-1": 0, "node-3": 100}},
		{"two failed nodes score below one", "node-1,node-3", map[string]int64{"node-1": 100, "node-3": 100, "node-4": 200}},
		{"blanks name no node", " , ", map[string]int64{"node-1": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "m1"}}
			if tc.annotation != "" {
				m.Annotations = map[string]string{v1alpha1.AnnotationPreferOtherNodes: tc.annotation}
			}
			pod, err := NewTargetPod(vmi, m, PodOptions{Image: "img", Acceleration: "tcg"}, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			na := pod.Spec.Affinity.NodeAffinity
			preferred, err := nodeaffinity.NewPreferredSchedulingTerms(na.PreferredDuringSchedulingIgnoredDuringExecution)
			if err != nil {
				t.Fatal(err)
			}
			required := nodeaffinity.NewLazyErrorNodeSelector(na.RequiredDuringSchedulingIgnoredDuringExecution)
			for name, want := range tc.want {
				if got := preferred.Score(node(name)); got != want {
					t.Errorf("node %s scores %d, want %d", name, got, want)
				}
				if ok, err := required.Match(node(name)); !ok || err != nil {
					t.Errorf("node %s no longer admitted (%v): a failed node stays a fallback", name, err)
				}
			}
			for _, term := range na.PreferredDuringSchedulingIgnoredDuringExecution {
				for _, f := range term.Preference.MatchFields {
					if len(f.Values) != 1 {
						t.Errorf("a field selector with %d values, which the API server refuses: %+v", len(f.Values), f)
					}
				}
			}
		})
	}
}

// A target kept off two nodes (KeepOff) is refused by both and admitted elsewhere, each node in a
// field selector of its own, as the API server takes them.
func TestKeepOffTwoNodes(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	vmi.Status.NodeName = "node-2"
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "m1"}}
	pod, err := NewTargetPod(vmi, m, PodOptions{Image: "img", Acceleration: "tcg"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	KeepOff(pod, []string{"node-1", "node-3"})
	required := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	for _, term := range required.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if len(f.Values) != 1 {
				t.Errorf("a field selector with %d values, which the API server refuses: %+v", len(f.Values), f)
			}
		}
	}
	selector := nodeaffinity.NewLazyErrorNodeSelector(required)
	for name, want := range map[string]bool{"node-1": false, "node-3": false, "node-4": true} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelKVMNode: "true"}}}
		if ok, err := selector.Match(n); ok != want || err != nil {
			t.Errorf("node %s admitted: %t (%v), want %t", name, ok, err, want)
		}
	}
}
