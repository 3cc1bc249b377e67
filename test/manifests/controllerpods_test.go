package manifests

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipods "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// launcherFixture is a VMI as a tenant makes it, booting from an allowed node directory, with a
// claim and its cloud-init user data in a Secret, and the controller's token.
type launcherFixture struct {
	ns         string
	vmi        *v1alpha1.VirtualMachineInstance
	opts       vmipods.PodOptions
	controller kubernetes.Interface
}

const userDataSecret = "vm-user-data"

func newLauncherFixture(t *testing.T) *launcherFixture {
	t.Helper()
	install(t)
	allowNodeDirectories(t, guestDir)
	t.Cleanup(func() { restoreConfig(t) })
	ns := testNamespace(t)
	v := vmiBooting("vm", v1alpha1.BootSource{Kernel: guestDir + "/vmlinuz"})
	v.Spec.Disks = []v1alpha1.Disk{{Name: "seed"}, {Name: "data"}}
	v.Spec.Volumes = []v1alpha1.Volume{
		{Name: "seed", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: userDataSecret}}},
		{Name: "data", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "data"}},
	}
	created, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(t.Context(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.NodeName = "node-1"
	return &launcherFixture{ns: ns, vmi: created, opts: vmipods.PodOptions{Image: "lifeboat.dev/lifeboat-launcher:dev", Acceleration: "kvm"},
		controller: tokenClient(t, controllerSA, nil)}
}

// launcher is the VMI's launcher pod as the controller builds it, changed by change.
func (f *launcherFixture) launcher(t *testing.T, change func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p, err := vmipods.NewLauncherPod(f.vmi, f.opts, []string{guestDir})
	if err != nil {
		t.Fatal(err)
	}
	change(p)
	return p
}

func dryRunCreate(ctx context.Context, pods typedcorev1.PodInterface, p *corev1.Pod) error {
	_, err := pods.Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// TestTheControllersTokenCreatesOnlyWhatALauncherNeeds uses the controller's token as a thief
// would, against the real API server and the shipped policies: a pod like the launcher the
// controller builds but for one escape (a host namespace, root, a capability, privilege
// escalation, a node path, another Secret, another kind of volume, a seccomp or AppArmor profile
// but the runtime's default, the root group, a host port, a node of its choosing, a toleration, an
// SELinux type but a container's or an SELinux user, role or level, a runtime class) is refused,
// each with the policy's message; the launcher and the migration target pods the controller
// really builds, with an allowed node directory, a claim and the VM's cloud-init Secret, are
// admitted.
func TestTheControllersTokenCreatesOnlyWhatALauncherNeeds(t *testing.T) {
	f := newLauncherFixture(t)
	ctx := t.Context()
	pods := f.controller.CoreV1().Pods(f.ns)
	waitEnforced(t, "a launcher pod on the host network", "shares no host namespace", func(ctx context.Context) error {
		return dryRunCreate(ctx, pods, f.launcher(t, func(p *corev1.Pod) { p.Spec.HostNetwork = true }))
	})

	if _, err := pods.Create(ctx, f.launcher(t, func(*corev1.Pod) {}), metav1.CreateOptions{}); err != nil {
		t.Errorf("the controller creating the launcher pod it builds: %v", err)
	}
	target, err := vmipods.NewTargetPod(f.vmi, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "9f0e"}}, f.opts, []string{guestDir}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := dryRunCreate(ctx, pods, target); err != nil {
		t.Errorf("the controller creating the migration target pod it builds: %v", err)
	}

	other, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(f.ns).Create(ctx, vmiBooting("other", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	compute := func(p *corev1.Pod) *corev1.Container { return &p.Spec.Containers[0] }
	secretVolume := func(name, secret string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}
	}
	const (
		hostNamespace = "a launcher pod shares no host namespace (hostNetwork, hostPID and hostIPC unset or false)"
		root          = "a launcher pod never runs as root"
		capability    = "a launcher pod's containers add no capability"
		escalation    = "a launcher pod's containers drop ALL capabilities and set allowPrivilegeEscalation false"
		volumeKind    = "a launcher pod has only the volumes a launcher uses"
		seccomp       = "a launcher pod runs under the container runtime's default seccomp profile: the pod sets seccompProfile RuntimeDefault and no container sets another"
		appArmor      = "a launcher pod runs under the container runtime's default AppArmor profile: neither it nor a container sets another (Unconfined or Localhost)"
		rootGroup     = "a launcher pod never runs with the root group: the pod sets runAsGroup other than 0, and neither it nor a container sets runAsGroup, fsGroup or a supplemental group 0"
		hostPort      = "a launcher pod's containers take no host port"
		nodeName      = "a launcher pod is placed by the scheduler (spec.nodeName unset)"
		toleration    = "a launcher pod tolerates no taint but node.kubernetes.io/not-ready and node.kubernetes.io/unreachable (NoExecute, for a bounded time), as the API server adds them"
		seLinuxType   = "a launcher pod runs under an SELinux type for containers: neither it nor a container sets a seLinuxOptions type but container_t, container_init_t or container_kvm_t ("
		seLinuxLabel  = "a launcher pod takes the SELinux user, role and level the container runtime gives it: neither it nor a container sets a seLinuxOptions user, role or level (but its namespace's own level, openshift.io/sa.scc.mcs)"
		runtimeClass  = "a launcher pod runs under the node's default container runtime handler (spec.runtimeClassName unset): lifeboat's controller is configured with no runtime class"
	)
	// A class the cluster admin made for other pods, as a thief would find it.
	unconfinedClass := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "lifeboat-test-unconfined"}, Handler: "unconfined"}
	if _, err := cluster.Kube.NodeV1().RuntimeClasses().Create(ctx, unconfinedClass, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Kube.NodeV1().RuntimeClasses().Delete(context.Background(), unconfinedClass.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting RuntimeClass %s: %v", unconfinedClass.Name, err)
		}
	})
	podSELinux := func(p *corev1.Pod) *corev1.SELinuxOptions {
		p.Spec.SecurityContext.SELinuxOptions = &corev1.SELinuxOptions{}
		return p.Spec.SecurityContext.SELinuxOptions
	}
	computeSELinux := func(p *corev1.Pod) *corev1.SELinuxOptions {
		compute(p).SecurityContext.SELinuxOptions = &corev1.SELinuxOptions{}
		return compute(p).SecurityContext.SELinuxOptions
	}
	initSELinux := func(p *corev1.Pod) *corev1.SELinuxOptions {
		c := compute(p).DeepCopy()
		c.Name, c.SecurityContext.SELinuxOptions = "init", &corev1.SELinuxOptions{}
		p.Spec.InitContainers = []corev1.Container{*c}
		return c.SecurityContext.SELinuxOptions
	}
	unconfined := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	noAppArmor := &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
	refusals := []struct {
		name, says string
		change     func(*corev1.Pod)
	}{
		{"the host's network", hostNamespace, func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
		{"the host's PID namespace", hostNamespace, func(p *corev1.Pod) { p.Spec.HostPID, p.Spec.ShareProcessNamespace = true, nil }},
		{"the host's IPC namespace", hostNamespace, func(p *corev1.Pod) { p.Spec.HostIPC = true }},
		{"a privileged container", "a launcher pod's containers are not privileged", func(p *corev1.Pod) {
			// The API server refuses privileged with allowPrivilegeEscalation false itself.
			compute(p).SecurityContext.Privileged, compute(p).SecurityContext.AllowPrivilegeEscalation = ptr.To(true), nil
		}},
		{"runAsUser 0 for the pod", root, func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsUser = ptr.To[int64](0) }},
		{"runAsUser 0 for the container", root, func(p *corev1.Pod) { compute(p).SecurityContext.RunAsUser = ptr.To[int64](0) }},
		{"runAsNonRoot false for the container", root, func(p *corev1.Pod) { compute(p).SecurityContext.RunAsNonRoot = ptr.To(false) }},
		{"no runAsNonRoot", root, func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsNonRoot = nil }},
		{"root in an init container", root, func(p *corev1.Pod) {
			c := compute(p).DeepCopy()
			c.Name, c.SecurityContext.RunAsUser = "init", ptr.To[int64](0)
			p.Spec.InitContainers = []corev1.Container{*c}
		}},
		{"an added capability", capability, func(p *corev1.Pod) {
			compute(p).SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
		}},
		{"privilege escalation (a set-user-ID program)", escalation, func(p *corev1.Pod) {
			compute(p).SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		}},
		{"capabilities not dropped", escalation, func(p *corev1.Pod) { compute(p).SecurityContext.Capabilities = nil }},
		{"the node's root directory", "hostPath / is not one", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
		{"the kubelet's pod directories", "hostPath /var/lib/kubelet/pods is not one", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "pods", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/pods", Type: ptr.To(corev1.HostPathDirectory)}}})
		}},
		{"a directory inside the allowed one", "hostPath " + guestDir + "/sub is not one", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "sub", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: guestDir + "/sub", Type: ptr.To(corev1.HostPathDirectory)}}})
		}},
		{"the allowed directory created if missing", "hostPath " + guestDir + " is not one", func(p *corev1.Pod) {
			for _, v := range p.Spec.Volumes {
				if v.HostPath != nil {
					v.HostPath.Type = ptr.To(corev1.HostPathDirectoryOrCreate)
				}
			}
		}},
		{"another Secret of the namespace", "Secret registry-key in volume vol-extra is not", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, secretVolume("vol-extra", "registry-key"))
		}},
		{"another Secret in place of the VM's", "Secret registry-key in volume vol-seed is not", func(p *corev1.Pod) {
			for _, v := range p.Spec.Volumes {
				if v.Secret != nil {
					v.Secret.SecretName = "registry-key"
				}
			}
		}},
		{"the VM's Secret for a pod another VMI controls", "VirtualMachineInstance other names it", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(other, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
		}},
		{"a ConfigMap", volumeKind + " (emptyDir, image, persistentVolumeClaim, its VM's cloud-init Secret, an allowed node directory): volume cm is none of them", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}}})
		}},
		{"a projected Secret", "volume projected is none of them", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "projected", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "registry-key"}}}}}}})
		}},
		{"an NFS export", "volume nfs is none of them", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "10.0.0.1", Path: "/"}}})
		}}, {"seccomp Unconfined for the pod", seccomp, func(p *corev1.Pod) { p.Spec.SecurityContext.SeccompProfile = unconfined }},
		{"seccomp Unconfined for the container", seccomp, func(p *corev1.Pod) { compute(p).SecurityContext.SeccompProfile = unconfined }},
		{"a node's own seccomp profile for the container", seccomp, func(p *corev1.Pod) {
			compute(p).SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("allow-all.json")}
		}},
		{"no seccomp profile", seccomp, func(p *corev1.Pod) { p.Spec.SecurityContext.SeccompProfile = nil }},
		{"AppArmor Unconfined for the pod", appArmor, func(p *corev1.Pod) { p.Spec.SecurityContext.AppArmorProfile = noAppArmor }},
		{"AppArmor Unconfined for the container", appArmor, func(p *corev1.Pod) { compute(p).SecurityContext.AppArmorProfile = noAppArmor }},
		{"AppArmor unconfined by the older annotation", appArmor, func(p *corev1.Pod) {
			p.Annotations["container.apparmor.security.beta.kubernetes.io/"+compute(p).Name] = "unconfined"
		}},
		{"runAsGroup 0 for the pod", rootGroup, func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsGroup = ptr.To[int64](0) }},
		{"runAsGroup 0 for the container", rootGroup, func(p *corev1.Pod) { compute(p).SecurityContext.RunAsGroup = ptr.To[int64](0) }},
		// Without one, the runtime takes the image's, which is 0 for a user the image does not name.
		{"no runAsGroup", rootGroup, func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsGroup = nil }},
		{"fsGroup 0", rootGroup, func(p *corev1.Pod) { p.Spec.SecurityContext.FSGroup = ptr.To[int64](0) }},
		{"the supplemental group 0", rootGroup, func(p *corev1.Pod) { p.Spec.SecurityContext.SupplementalGroups = []int64{0} }},
		{"the kubelet's port as a host port", hostPort, func(p *corev1.Pod) {
			compute(p).Ports = []corev1.ContainerPort{{ContainerPort: 8443, HostPort: 10250, Protocol: corev1.ProtocolTCP}}
		}},
		{"a host port in an init container", hostPort, func(p *corev1.Pod) {
			c := compute(p).DeepCopy()
			c.Name, c.Ports = "init", []corev1.ContainerPort{{ContainerPort: 8186, HostPort: 8186, Protocol: corev1.ProtocolTCP}}
			p.Spec.InitContainers = []corev1.Container{*c}
		}},
		{"a node of its choosing", nodeName, func(p *corev1.Pod) { p.Spec.NodeName = "control-plane-1" }},
		{"a toleration of the control plane's taint", toleration, func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		}},
		{"a toleration of every taint", toleration, func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}},
		{"a node that is not ready tolerated for ever", toleration, func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
		}},
		// spc_t: SELinux does not confine the pod.
		{"SELinux type spc_t for the pod", seLinuxType + "spc_t is not one)", func(p *corev1.Pod) { podSELinux(p).Type = "spc_t" }},
		{"SELinux type spc_t for the container", seLinuxType + "spc_t is not one)", func(p *corev1.Pod) { computeSELinux(p).Type = "spc_t" }},
		{"SELinux type unconfined_t for an init container", seLinuxType + "unconfined_t is not one)", func(p *corev1.Pod) {
			initSELinux(p).Type = "unconfined_t"
		}},
		{"an SELinux user for the pod", seLinuxLabel, func(p *corev1.Pod) { podSELinux(p).User = "system_u" }},
		{"an SELinux user for the container", seLinuxLabel, func(p *corev1.Pod) { computeSELinux(p).User = "system_u" }},
		{"an SELinux role for the pod", seLinuxLabel, func(p *corev1.Pod) { podSELinux(p).Role = "system_r" }},
		{"an SELinux role for the container", seLinuxLabel, func(p *corev1.Pod) { computeSELinux(p).Role = "system_r" }},
		// Another pod's categories: its files become the launcher's to read and write.
		{"an SELinux level for the pod", seLinuxLabel, func(p *corev1.Pod) { podSELinux(p).Level = "s0:c123,c456" }},
		{"an SELinux level for the container", seLinuxLabel, func(p *corev1.Pod) { computeSELinux(p).Level = "s0:c123,c456" }},
		{"an SELinux level for an init container", seLinuxLabel, func(p *corev1.Pod) { initSELinux(p).Level = "s0" }},
		{"a runtime class", runtimeClass, func(p *corev1.Pod) { p.Spec.RuntimeClassName = &unconfinedClass.Name }},
	}
	for _, r := range refusals {
		wantForbidden(t, "the controller's token creating a launcher pod with "+r.name, dryRunCreate(ctx, pods, f.launcher(t, r.change)), r.says)
	}
	// The types Pod Security "baseline" allows pass (named apart from the launcher created above).
	for _, typ := range []string{"container_t", "container_init_t", "container_kvm_t"} {
		if err := dryRunCreate(ctx, pods, f.launcher(t, func(p *corev1.Pod) {
			p.Name, computeSELinux(p).Type = "launcher-"+strings.ReplaceAll(typ, "_", "-"), typ
		})); err != nil {
			t.Errorf("the controller's token creating a launcher pod with SELinux type %s: %v", typ, err)
		}
	}

	// Where OpenShift's constraints give every pod its namespace's level, that level passes, and
	// no other.
	nsObj, err := cluster.Kube.CoreV1().Namespaces().Get(ctx, f.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	metav1.SetMetaDataAnnotation(&nsObj.ObjectMeta, "openshift.io/sa.scc.mcs", "s0:c26,c5")
	if _, err := cluster.Kube.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	withLevel := func(level string) *corev1.Pod {
		return f.launcher(t, func(p *corev1.Pod) { p.Name, podSELinux(p).Level = "launcher-mcs", level })
	}
	// The policy reads the namespace from the API server's cache, a moment behind the update.
	kubewait.For(t, 30*time.Second, "the controller's token admitted to create a launcher pod with its namespace's SELinux level",
		func(ctx context.Context) (struct{}, error) {
			return struct{}{}, dryRunCreate(ctx, pods, withLevel("s0:c26,c5"))
		},
		func(struct{}) bool { return true }, nil)
	wantForbidden(t, "the controller's token creating a launcher pod with another level than its namespace's", dryRunCreate(ctx, pods, withLevel("s0:c123,c456")), seLinuxLabel)

	// Nor anything else in Kubernetes' own namespace.
	wantForbidden(t, "the controller's token creating a pod in kube-system", dryRunCreate(ctx, f.controller.CoreV1().Pods("kube-system"),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "miner"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.org/miner:1"}}}}),
		"launcher pods only")
}

// TestTheControllersTokenChangesOnlyWhatLifeboatWrites: with the controller's token, the writes
// lifeboat makes to a launcher pod (the descheduler's annotation, the readiness gate's condition)
// and its deletion go through; any other change of a launcher pod (its image, a label, its owner,
// a finalizer, another annotation, its readiness, its address), and any change or deletion of a
// pod that is not a launcher, is refused with the policy's message.
func TestTheControllersTokenChangesOnlyWhatLifeboatWrites(t *testing.T) {
	f := newLauncherFixture(t)
	ctx := t.Context()
	pods := f.controller.CoreV1().Pods(f.ns)
	launcher, err := pods.Create(ctx, f.launcher(t, func(*corev1.Pod) {}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the controller creating its launcher pod: %v", err)
	}
	bystander, err := cluster.Kube.CoreV1().Pods(f.ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.org/web:1"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := func(ctx context.Context, name string, pt types.PatchType, body map[string]any, subresources ...string) error {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pods.Patch(ctx, name, pt, data, metav1.PatchOptions{}, subresources...)
		return err
	}
	annotate := func(key string, value any) map[string]any {
		return map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}}
	}
	condition := func(typ string, status corev1.ConditionStatus) map[string]any {
		return map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{{Type: corev1.PodConditionType(typ), Status: status, Reason: "Test"}}}}
	}
	const (
		onlyLaunchers = "lifeboat's controller changes and deletes launcher pods only"
		onlyLifeboats = "lifeboat's controller changes of a launcher pod only the annotation descheduler.alpha.kubernetes.io/eviction-in-progress"
		onlyGate      = "lifeboat's controller writes of a launcher pod's status only the condition lifeboat.dev/guest-running"
	)
	waitEnforced(t, "a launcher pod's other annotation", onlyLifeboats, func(ctx context.Context) error {
		return patch(ctx, launcher.Name, types.MergePatchType, annotate("example.org/x", "y"))
	})

	// What lifeboat writes.
	if err := patch(ctx, launcher.Name, types.MergePatchType, annotate(v1alpha1.AnnotationEvictionInProgress, "")); err != nil {
		t.Errorf("the controller setting the descheduler's annotation: %v", err)
	}
	if err := patch(ctx, launcher.Name, types.MergePatchType, annotate(v1alpha1.AnnotationEvictionInProgress, nil)); err != nil {
		t.Errorf("the controller removing the descheduler's annotation: %v", err)
	}
	if err := patch(ctx, launcher.Name, types.StrategicMergePatchType, condition(string(v1alpha1.PodConditionGuestRunning), corev1.ConditionTrue), "status"); err != nil {
		t.Errorf("the controller setting the readiness gate's condition: %v", err)
	}

	refusals := []struct {
		name, says string
		pod        string
		pt         types.PatchType
		body       map[string]any
		sub        []string
	}{
		{"a launcher pod's image", onlyLifeboats, launcher.Name, types.StrategicMergePatchType,
			map[string]any{"spec": map[string]any{"containers": []map[string]any{{"name": "compute", "image": "example.org/miner:1"}}}}, nil},
		{"a launcher pod's label", onlyLifeboats, launcher.Name, types.MergePatchType,
			map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "web"}}}, nil},
		{"a launcher pod's owner", onlyLifeboats, launcher.Name, types.MergePatchType,
			map[string]any{"metadata": map[string]any{"ownerReferences": nil}}, nil},
		{"a finalizer on a launcher pod", onlyLifeboats, launcher.Name, types.MergePatchType,
			map[string]any{"metadata": map[string]any{"finalizers": []string{"example.org/hold"}}}, nil},
		{"another annotation of a launcher pod", onlyLifeboats, launcher.Name, types.MergePatchType, annotate(v1alpha1.AnnotationRequestEvictOnly, nil), nil},
		{"an annotation through the status", onlyLifeboats, launcher.Name, types.MergePatchType, annotate("example.org/x", "y"), []string{"status"}},
		{"a launcher pod's Ready condition", onlyGate, launcher.Name, types.StrategicMergePatchType, condition(string(corev1.PodReady), corev1.ConditionTrue), []string{"status"}},
		{"a launcher pod's phase", onlyGate, launcher.Name, types.MergePatchType, map[string]any{"status": map[string]any{"phase": "Running"}}, []string{"status"}},
		{"a launcher pod's message", onlyGate, launcher.Name, types.MergePatchType, map[string]any{"status": map[string]any{"message": "fine"}}, []string{"status"}},
		{"another pod's annotation", onlyLaunchers, bystander.Name, types.MergePatchType, annotate(v1alpha1.AnnotationEvictionInProgress, ""), nil},
		{"another pod's readiness", onlyLaunchers, bystander.Name, types.StrategicMergePatchType, condition(string(corev1.PodReady), corev1.ConditionTrue), []string{"status"}},
		{"another pod's image", onlyLaunchers, bystander.Name, types.StrategicMergePatchType,
			map[string]any{"spec": map[string]any{"containers": []map[string]any{{"name": "web", "image": "example.org/miner:1"}}}}, nil},
	}
	for _, r := range refusals {
		wantForbidden(t, "the controller's token changing "+r.name, patch(ctx, r.pod, r.pt, r.body, r.sub...), r.says)
	}
	wantForbidden(t, "the controller's token deleting another pod", pods.Delete(ctx, bystander.Name, metav1.DeleteOptions{}), onlyLaunchers)

	got, err := cluster.Kube.CoreV1().Pods(f.ns).Get(ctx, launcher.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := got.Spec.Containers[0].Image; img != f.opts.Image {
		t.Errorf("the launcher pod's image is %s, want %s", img, f.opts.Image)
	}
	if err := pods.Delete(ctx, launcher.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the controller deleting its launcher pod: %v", err)
	}
}
