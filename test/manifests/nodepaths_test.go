package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// guestDir is the one node directory these tests allow, as a lab admin would for the test guest.
const guestDir = "/var/lib/lifeboat/guest"

// allowNodeDirectories has the cluster admin allow dirs in the LifeboatConfig, with a field
// manager of its own, so that reapplying manifests/ keeps them.
func allowNodeDirectories(t *testing.T, dirs ...string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "LifeboatConfig",
		"metadata": map[string]any{"name": v1alpha1.ConfigName},
		"spec":     map[string]any{"allowedNodeDirectories": dirs},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Patch(context.Background(), v1alpha1.ConfigName, types.ApplyPatchType, patch,
		metav1.PatchOptions{FieldManager: "cluster-admin", Force: ptr.To(true)})
	if err != nil {
		t.Fatalf("allowing node directories %v: %v", dirs, err)
	}
	// The admission policy reads the LifeboatConfig through the API server's own cache, a moment
	// behind the patch: wait until it admits a boot file in each directory (dry runs).
	for _, dir := range dirs {
		probe := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "allowed-probe", Namespace: metav1.NamespaceDefault},
			Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), Boot: v1alpha1.BootSource{Kernel: dir + "/vmlinuz"}}}
		var last error
		err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, last = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(metav1.NamespaceDefault).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return last == nil, nil
		})
		if err != nil {
			t.Fatalf("the node-path policy still refuses %s after it was allowed: %v", dir, last)
		}
	}
}

// vmOwner is a namespace user who may do everything with VMIs in one namespace, and nothing else.
func vmOwner(t *testing.T, ns string) lifeboatclient.Interface {
	t.Helper()
	ctx := context.Background()
	const user = "vm-owner"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "vm-owner"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachineinstances"}, Verbs: []string{"*"},
	}}}
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vm-owner"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return lifeboatclient.NewForConfigOrDie(cfg)
}

func vmiBooting(name string, boot v1alpha1.BootSource) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"), Boot: boot},
	}
}

// A user who may create VMIs in one namespace asks, through the real API server, for the node's
// files: lifeboat as installed from manifests/ refuses each with a message naming the allowed
// directories, and the one launcher pod that exists mounts nothing of the node but lifeboat's
// run directory and the allowed directory.
func TestANamespaceUserCannotReachTheNodesFiles(t *testing.T) {
	install(t)
	allowNodeDirectories(t, guestDir)
	ns := testNamespace(t)
	owner := vmOwner(t, ns).LifeboatV1alpha1().VirtualMachineInstances(ns)
	startReplica(t, serviceAccountKubeconfig(t, controllerSA), "node-paths")
	ctx := context.Background()

	kernel := guestDir + "/vmlinuz"
	for _, tc := range []struct {
		name string
		boot v1alpha1.BootSource
		want string
	}{
		{"the node's password file as a kernel", v1alpha1.BootSource{Kernel: "/etc/shadow"}, `boot.kernel "/etc/shadow"`},
		{"the node's disk as the guest's", v1alpha1.BootSource{Kernel: kernel, Disk: "/dev/sda"}, `boot.disk "/dev/sda"`},
		{"the kubelet's directory", v1alpha1.BootSource{Kernel: kernel, Initrd: "/var/lib/kubelet"}, `boot.initrd "/var/lib/kubelet"`},
		{"a .. out of the allowed directory", v1alpha1.BootSource{Kernel: guestDir + "/../../kubelet/config.yaml"}, `boot.kernel "` + guestDir + `/../../kubelet/config.yaml"`},
		{"the allowed directory's prefix", v1alpha1.BootSource{Kernel: guestDir + "-other/vmlinuz"}, `boot.kernel "` + guestDir + `-other/vmlinuz"`},
	} {
		_, err := owner.Create(ctx, vmiBooting("refused", tc.boot), metav1.CreateOptions{})
		if err == nil {
			t.Errorf("%s: created; want it refused", tc.name)
			continue
		}
		msg := err.Error()
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "allowedNodeDirectories: "+guestDir) {
			t.Errorf("%s: %v; want a refusal naming %s and the allowed directories", tc.name, err, tc.want)
		}
	}

	// The same user may create a VMI that boots from the allowed directory: only the paths were refused.
	ok, err := owner.Create(ctx, vmiBooting("allowed", v1alpha1.BootSource{Kernel: kernel, Initrd: guestDir + "/initrd.gz"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a VMI booting from %s: %v", guestDir, err)
	}
	pod := waitLauncherPod(t, ns, ok)
	for _, v := range pod.Spec.Volumes {
		if hp := v.HostPath; hp != nil && hp.Path != "/var/run/lifeboat" && hp.Path != guestDir {
			t.Errorf("launcher pod %s mounts the node's %s; want only /var/run/lifeboat and %s", pod.Name, hp.Path, guestDir)
		}
	}
}

// Without the admission policy (an admin deleted its binding), the controller still gives a VMI
// that names a node path outside the allowed directories no launcher pod, and says why.
func TestTheControllerRefusesWhatAdmissionMissed(t *testing.T) {
	install(t)
	allowNodeDirectories(t, guestDir)
	ctx := context.Background()
	bindings := cluster.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	binding, err := bindings.Get(ctx, "lifeboat-vmi-node-paths", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		binding.ResourceVersion, binding.UID = "", ""
		if _, err := bindings.Create(context.Background(), binding, metav1.CreateOptions{}); err != nil {
			t.Errorf("restoring the binding: %v", err)
		}
	})
	ns := testNamespace(t)
	startReplica(t, serviceAccountKubeconfig(t, controllerSA), "node-paths-unbound")
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	// The API server may take a moment to notice the binding is gone.
	var refused *v1alpha1.VirtualMachineInstance
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		refused, err = vmis.Create(ctx, vmiBooting("shadow", v1alpha1.BootSource{Kernel: "/etc/shadow"}), metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("with the policy unbound a VMI naming /etc/shadow should be admitted: %v", err)
	}
	var event *corev1.Event
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := cluster.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=shadow,reason=" + vmi.ReasonNodePathRefused})
		if err != nil || len(evs.Items) == 0 {
			return false, nil
		}
		event = &evs.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no %s Event on the VMI within 30s", vmi.ReasonNodePathRefused)
	}
	if want := fmt.Sprintf(`boot.kernel "/etc/shadow" is not a clean path inside a node directory the cluster admin allows (LifeboatConfig "cluster" spec.allowedNodeDirectories: %s)`, guestDir); event.Message != want {
		t.Errorf("the Event says %q, want %q", event.Message, want)
	}
	pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(refused.UID)})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("the refused VMI has launcher pods %v (%v); want none", pods.Items, err)
	}
}

// waitLauncherPod waits until the VMI controller gave v its launcher pod.
func waitLauncherPod(t *testing.T, ns string, v *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
		if err != nil || len(pods.Items) != 1 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("VMI %s/%s got no launcher pod within 30s", ns, v.Name)
	}
	return pod
}
