package manifests

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// bound is a client of user, granted role (a ClusterRole, or a Role of ns) in ns.
func bound(t *testing.T, ns, user string, role rbacv1.RoleRef) lifeboatclient.Interface {
	t.Helper()
	b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, RoleRef: role,
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(t.Context(), b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return lifeboatclient.NewForConfigOrDie(cfg)
}

func impersonate(sa string) lifeboatclient.Interface {
	user, groups := serviceAccountUser(sa)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return lifeboatclient.NewForConfigOrDie(cfg)
}

// TestOnlyLifeboatWritesItsStatusRecords: a namespace user granted every verb on every lifeboat.dev
// resource of its namespace, the status subresources included (resources ["*"], a common grant),
// still cannot record a migration as an evacuation (which would count it against the evacuation
// limits) nor change which pod is a VMI's launcher (which the agent binds the VM to); lifeboat's
// controller records both.
func TestOnlyLifeboatWritesItsStatusRecords(t *testing.T) {
	install(t)
	ctx := t.Context()
	ns := testNamespace(t)
	const (
		evacuationSays = "a migration's evacuation record (status.evacuation) is lifeboat's controller's to write: it makes the migration count against the evacuation limits"
		launcherSays   = "a VMI's launcher pod (status.launcherPod) is lifeboat's to record: only its controller, and the agent of the VMI's node as it hands the VMI to its migration's target, write it"
	)
	wildcard := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "lifeboat-everything"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"*"}, Verbs: []string{"*"}},
	}}
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(ctx, wildcard, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user := bound(t, ns, "lifeboat-everything", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: wildcard.Name}).LifeboatV1alpha1()
	controller := impersonate(controllerSA).LifeboatV1alpha1()

	vmi, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, vmiBooting("vm", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmi.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: "launcher-vm-abcde", UID: "5b1c0d2e-0000-4000-8000-000000000001"}
	if vmi, err = controller.VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("lifeboat's controller recording a VMI's launcher pod: %v", err)
	}
	dryRun := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	repointed := vmi.DeepCopy()
	repointed.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: "lookalike", UID: "5b1c0d2e-0000-4000-8000-000000000002"}
	// Any other refusal (the authorizer, before it sees the new RoleBinding) does not count.
	waitEnforced(t, "a VMI's launcher pod", launcherSays, func(ctx context.Context) error {
		_, err := user.VirtualMachineInstances(ns).UpdateStatus(ctx, repointed, dryRun)
		return err
	})
	_, err = user.VirtualMachineInstances(ns).UpdateStatus(ctx, repointed, metav1.UpdateOptions{})
	wantForbidden(t, "a user pointing a VMI at another launcher pod", err, launcherSays)
	cleared := vmi.DeepCopy()
	cleared.Status.LauncherPod = nil
	_, err = user.VirtualMachineInstances(ns).UpdateStatus(ctx, cleared, metav1.UpdateOptions{})
	wantForbidden(t, "a user removing a VMI's launcher pod", err, launcherSays)
	// Nor does a cluster admin's own request: only lifeboat records it.
	_, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(ctx, repointed, metav1.UpdateOptions{})
	wantForbidden(t, "a cluster admin pointing a VMI at another launcher pod", err, launcherSays)
	// The rest of the status stays the user's to write, as RBAC says.
	other := vmi.DeepCopy()
	other.Status.Reason = "WrittenByTheUser"
	if _, err := user.VirtualMachineInstances(ns).UpdateStatus(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Errorf("a user's status write that leaves the launcher pod: %v", err)
	}

	m, err := user.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("manual", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a user's plain (Manual) migration: %v", err)
	}
	m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: string(vmi.UID)}
	_, err = user.VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, m, metav1.UpdateOptions{})
	wantForbidden(t, "a user recording its migration as an evacuation", err, evacuationSays)
	if m, err = controller.VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("lifeboat's controller recording an evacuation's migration: %v", err)
	}
	waiting := m.DeepCopy()
	waiting.Status.Evacuation.WaitingForSlot = true
	_, err = user.VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, waiting, metav1.UpdateOptions{})
	wantForbidden(t, "a user changing an evacuation record", err, evacuationSays)
	unrecorded := m.DeepCopy()
	unrecorded.Status.Evacuation = nil
	_, err = user.VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, unrecorded, metav1.UpdateOptions{})
	wantForbidden(t, "a user removing an evacuation record", err, evacuationSays)
	got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Get(ctx, m.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.EvacuatedVMI() != vmi.UID || got.Status.Evacuation.WaitingForSlot {
		t.Errorf("the migration's evacuation record is %+v, want the controller's (VMI UID %s, not waiting)", got.Status.Evacuation, vmi.UID)
	}
}

// TestTheTenantRolesRunVMsAndWriteNoStatus: a namespace user granted Kubernetes' own edit role
// (lifeboat-vm-edit aggregates into it) creates a VM and a migration, but may not write their
// status; one granted view reads them and creates nothing.
func TestTheTenantRolesRunVMsAndWriteNoStatus(t *testing.T) {
	install(t)
	ctx := t.Context()
	ns := testNamespace(t)
	editor := bound(t, ns, "vm-owner", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"}).LifeboatV1alpha1()
	viewer := bound(t, ns, "vm-watcher", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"}).LifeboatV1alpha1()
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm"},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: v1alpha1.RunStrategyAlways, Template: v1alpha1.VirtualMachineInstanceTemplateSpec{
			Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"),
				Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/guest-kernel:1", KernelPath: "/boot/vmlinuz"}}}}},
	}
	// The aggregation controller adds lifeboat-vm-edit's rules to edit, and the authorizer sees
	// the new RoleBinding, a moment after they are stored.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = editor.VirtualMachines(ns).Create(ctx, vm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	}); err != nil {
		t.Fatalf("a user with the edit role never could create a VM: %v", last)
	}
	if _, err := editor.VirtualMachines(ns).Create(ctx, vm, metav1.CreateOptions{}); err != nil {
		t.Errorf("a user with the edit role creating a VM: %v", err)
	}
	m, err := editor.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("manual", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a user with the edit role creating a migration: %v", err)
	}
	m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: "uid-of-another-tenants-vm"}
	_, err = editor.VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, m, metav1.UpdateOptions{})
	wantRBACRefusal(t, "a user with the edit role writing a migration's status", err, `cannot update resource "virtualmachineinstancemigrations/status"`)
	vmi, err := editor.VirtualMachineInstances(ns).Create(ctx, vmiBooting("vmi", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a user with the edit role creating a VMI: %v", err)
	}
	vmi.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: "lookalike", UID: "5b1c0d2e-0000-4000-8000-000000000002"}
	_, err = editor.VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{})
	wantRBACRefusal(t, "a user with the edit role writing a VMI's status", err, `cannot update resource "virtualmachineinstances/status"`)

	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = viewer.VirtualMachines(ns).Get(ctx, vm.Name, metav1.GetOptions{})
		return last == nil, nil
	}); err != nil {
		t.Fatalf("a user with the view role never could read a VM: %v", last)
	}
	if list, err := viewer.VirtualMachineInstanceMigrations(ns).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 1 {
		t.Errorf("a user with the view role listing migrations: %v, %v", err, list)
	}
	_, err = viewer.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("viewers", nil), metav1.CreateOptions{})
	wantRBACRefusal(t, "a user with the view role creating a migration", err, `cannot create resource "virtualmachineinstancemigrations"`)
}

// wantRBACRefusal wants err to be the authorizer's refusal, saying says.
func wantRBACRefusal(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %v; want RBAC to refuse it, saying %q", what, err, says)
	}
}
