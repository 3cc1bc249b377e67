package manifests

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipods "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// TestOnlyLaunchersGetDevices: a tenant who may create pods cannot get the agents' devices
// (/dev/kvm, /dev/net/tun, /dev/vhost-net, /dev/userfaultfd) by asking for devices.lifeboat.dev/*,
// in a container or an init container, directly or through a ReplicaSet, and neither can a
// cluster admin's own requests; each refusal names the device. The launcher pods lifeboat's
// controller builds are admitted with theirs, a migration target's userfaultfd only while the
// cluster admin allows post-copy.
func TestOnlyLaunchersGetDevices(t *testing.T) {
	install(t)
	ctx := t.Context()
	ns := testNamespace(t)
	kube, _ := tenant(t, ns, "device-thief")
	pods := kube.CoreV1().Pods(ns)
	const onlyLaunchers = ", which only lifeboat's launcher pods may: only lifeboat's controller"
	asking := func(name, device string, init bool) *corev1.Pod {
		c := corev1.Container{Name: "c", Image: "example.org/anything:1", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceName(device): resource.MustParse("1")}}}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "main", Image: "example.org/anything:1"}}}}
		if init {
			p.Spec.InitContainers = []corev1.Container{c}
		} else {
			p.Spec.Containers = []corev1.Container{c}
		}
		return p
	}
	waitEnforced(t, "pods", onlyLaunchers, func(ctx context.Context) error {
		_, err := pods.Create(ctx, asking("probe", v1alpha1.DeviceKVM, false), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})

	for _, device := range []string{v1alpha1.DeviceKVM, v1alpha1.DeviceTun, v1alpha1.DeviceResourcePrefix + "vhost-net", v1alpha1.DeviceUserFaultFD} {
		name := strings.TrimPrefix(device, v1alpha1.DeviceResourcePrefix)
		says := "this pod requests " + device + onlyLaunchers
		_, err := pods.Create(ctx, asking(name, device, false), metav1.CreateOptions{})
		wantForbidden(t, "a tenant's pod asking for "+device, err, says)
		_, err = pods.Create(ctx, asking(name+"-init", device, true), metav1.CreateOptions{})
		wantForbidden(t, "a tenant's init container asking for "+device, err, says)
		_, err = cluster.Kube.CoreV1().Pods(ns).Create(ctx, asking(name, device, false), metav1.CreateOptions{})
		wantForbidden(t, "a cluster admin's pod asking for "+device, err, says)
	}
	// The QEMU probe's pods, in lifeboat's namespace, may have /dev/kvm as launchers do, and
	// nothing more; no other pod there gets a device, nor a look-alike elsewhere.
	probe := func(name, device string) *corev1.Pod {
		p := asking(name, device, false)
		p.Labels = map[string]string{"app.kubernetes.io/name": contract.QEMUProbeApp}
		return p
	}
	system := cluster.Kube.CoreV1().Pods(controlplane.LifeboatNamespace)
	probeDryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := system.Create(ctx, probe("qemu-probe", v1alpha1.DeviceKVM), probeDryRun); err != nil {
		t.Errorf("the QEMU probe's pod asking for %s: %v", v1alpha1.DeviceKVM, err)
	}
	_, err := system.Create(ctx, probe("qemu-probe-tun", v1alpha1.DeviceTun), probeDryRun)
	wantForbidden(t, "the QEMU probe's pod asking for "+v1alpha1.DeviceTun, err,
		"this pod requests "+v1alpha1.DeviceTun+onlyLaunchers)
	_, err = system.Create(ctx, asking("not-the-probe", v1alpha1.DeviceKVM, false), probeDryRun)
	wantForbidden(t, "another pod in lifeboat's namespace asking for "+v1alpha1.DeviceKVM, err, "this pod requests "+v1alpha1.DeviceKVM+onlyLaunchers)
	_, err = cluster.Kube.CoreV1().Pods(ns).Create(ctx, probe("qemu-probe", v1alpha1.DeviceKVM), probeDryRun)
	wantForbidden(t, "a pod labelled as the QEMU probe outside lifeboat's namespace asking for "+v1alpha1.DeviceKVM, err, "this pod requests "+v1alpha1.DeviceKVM+onlyLaunchers)

	if _, err := pods.Create(ctx, asking("plain", "example.org/gpu", false), metav1.CreateOptions{}); err != nil {
		t.Errorf("a tenant's pod asking for another extended resource: %v", err)
	}

	// A workload's pods are created by Kubernetes' own controller, which gets no device either:
	// the ReplicaSet says why it has no pod.
	template := asking("", v1alpha1.DeviceKVM, false)
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "kvm-workload"}, Spec: appsv1.ReplicaSetSpec{
		Replicas: ptr.To[int32](1),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kvm-workload"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "kvm-workload"}}, Spec: template.Spec},
	}}
	if rs, err := cluster.Kube.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating a ReplicaSet whose pods ask for %s: %v", v1alpha1.DeviceKVM, err)
	} else {
		var failure string
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := cluster.Kube.AppsV1().ReplicaSets(ns).Get(ctx, rs.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range got.Status.Conditions {
				if c.Type == appsv1.ReplicaSetReplicaFailure {
					failure = c.Message
				}
			}
			return failure != "", nil
		})
		if !strings.Contains(failure, "this pod requests "+v1alpha1.DeviceKVM+onlyLaunchers) {
			t.Errorf("a ReplicaSet whose pods ask for %s: failure %q, want its pods refused for the device", v1alpha1.DeviceKVM, failure)
		}
		if list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=kvm-workload"}); err != nil || len(list.Items) != 0 {
			t.Errorf("the ReplicaSet has pods %v (%v), want none", list, err)
		}
	}

	// The controller's own launcher pods, as it builds them.
	vmi, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, vmiBooting("vm", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmi.Status.NodeName = "node-1"
	opts := vmipods.PodOptions{Image: "lifeboat.dev/lifeboat-launcher:dev", Acceleration: "kvm"}
	controller := tokenClient(t, controllerSA, nil).CoreV1().Pods(ns)
	source, err := vmipods.NewLauncherPod(vmi, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := source.Spec.Containers[0].Resources.Limits[v1alpha1.DeviceKVM]; !ok {
		t.Fatalf("the launcher pod asks for no %s: %v", v1alpha1.DeviceKVM, source.Spec.Containers[0].Resources)
	}
	if _, err := controller.Create(ctx, source, metav1.CreateOptions{}); err != nil {
		t.Errorf("lifeboat's controller creating a launcher pod with %s: %v", v1alpha1.DeviceKVM, err)
	}

	target, err := vmipods.NewTargetPod(vmi, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "9f0e"}}, opts, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	_, err = controller.Create(ctx, target, dryRun)
	wantForbidden(t, "lifeboat's controller creating a target pod with a userfaultfd while post-copy is not allowed", err,
		"devices.lifeboat.dev/userfaultfd is given only while post-copy is allowed")

	allowPostCopy(t, true)
	t.Cleanup(func() { restoreConfig(t) })
	var last error
	if wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = controller.Create(ctx, target, dryRun)
		return last == nil, nil
	}) != nil {
		t.Errorf("lifeboat's controller creating a migration's target pod with a userfaultfd while post-copy is allowed: %v", last)
	}
	sourceWithFD := source.DeepCopy()
	sourceWithFD.Name += "-fd"
	sourceWithFD.Spec.Containers[0].Resources.Limits[v1alpha1.DeviceUserFaultFD] = resource.MustParse("1")
	sourceWithFD.Spec.Containers[0].Resources.Requests[v1alpha1.DeviceUserFaultFD] = resource.MustParse("1")
	_, err = controller.Create(ctx, sourceWithFD, dryRun)
	wantForbidden(t, "lifeboat's controller creating a launcher pod that is no migration's target with a userfaultfd", err,
		"devices.lifeboat.dev/userfaultfd is only for a migration's target launcher pod")
}

// allowPostCopy has the cluster admin set spec.migrations.allowPostCopy in the LifeboatConfig,
// with a field manager of its own.
func allowPostCopy(t *testing.T, allow bool) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "LifeboatConfig",
		"metadata": map[string]any{"name": v1alpha1.ConfigName},
		"spec":     map[string]any{"migrations": map[string]any{"allowPostCopy": allow}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Patch(context.Background(), v1alpha1.ConfigName, types.ApplyPatchType, patch,
		metav1.PatchOptions{FieldManager: "post-copy-admin", Force: ptr.To(true)})
	if err != nil {
		t.Fatalf("setting allowPostCopy to %t: %v", allow, err)
	}
}

// restoreConfig applies manifests/' LifeboatConfig again, taking back the fields the tests' admins
// changed, so that applying manifests/ later changes nothing.
func restoreConfig(t *testing.T) {
	t.Helper()
	for _, o := range install(t) {
		if o.GetKind() != "LifeboatConfig" {
			continue
		}
		data, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Patch(context.Background(), o.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: fieldManager, Force: ptr.To(true)}); err != nil {
			t.Fatalf("applying manifests/' LifeboatConfig again: %v", err)
		}
	}
}
