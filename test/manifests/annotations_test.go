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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// editor is a namespace user with every ordinary verb on VMIs and migrations in ns, as the
// aggregated edit role would give, and, if canceller, lifeboat-evacuation-canceller there too.
func editor(t *testing.T, ns, user string, canceller bool) lifeboatclient.Interface {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachineinstances", "virtualmachineinstancemigrations"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}}}
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind := func(name string, ref rbacv1.RoleRef) {
		b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, RoleRef: ref,
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind(user, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name})
	if canceller {
		bind(user+"-canceller", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "lifeboat-evacuation-canceller"})
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return lifeboatclient.NewForConfigOrDie(cfg)
}

func migration(name string, annotations map[string]string) *v1alpha1.VirtualMachineInstanceMigration {
	return &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"},
	}
}

// waitEnforced waits until try, a dry run, is refused saying says: the API server loads newly
// installed policies a moment after they are stored. Any other refusal does not count: the
// authorizer also refuses for a moment after a new RoleBinding, before the policy is in force.
func waitEnforced(t *testing.T, what, says string, try func(ctx context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = try(ctx)
		return refused(last, says), nil
	})
	if err != nil {
		t.Fatalf("the API server never enforced the policy on %s within 30s: last answer %v, want a refusal saying %q", what, last, says)
	}
}

func refused(err error, says string) bool {
	return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), says)
}

func wantForbidden(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !refused(err, says) {
		t.Errorf("%s: %v; want it refused, saying %q", what, err, says)
	}
}

// A namespace user who may edit VMIs and migrations cannot steer an evacuation: not the cause or
// deadline of a migration (which would make lifeboat pause or post-copy a guest as if a kubelet
// were killing it), and not its cancellation (which would hold a drain hostage), unless a
// cluster admin grants lifeboat-evacuation-canceller. lifeboat's controller sets the cause.
func TestOnlyTheirOwnersSteerAnEvacuation(t *testing.T) {
	install(t)
	ctx := context.Background()
	ns := testNamespace(t)
	user := editor(t, ns, "vm-editor", false).LifeboatV1alpha1()
	const causeMsg = "lifeboat.dev/cause and lifeboat.dev/deadline are lifeboat's to set"
	const cancelMsg = "needs the verb cancel-evacuation"
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	waitEnforced(t, "migrations", causeMsg, func(ctx context.Context) error {
		_, err := user.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("probe", map[string]string{v1alpha1.AnnotationCause: "NodePressure"}), dryRun)
		return err
	})

	_, err := user.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("forged-cause", map[string]string{v1alpha1.AnnotationCause: "NodePressure"}), metav1.CreateOptions{})
	wantForbidden(t, "a user's migration with a cause", err, causeMsg)
	_, err = user.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("forged-deadline", map[string]string{v1alpha1.AnnotationDeadline: "2026-01-01T00:00:00Z"}), metav1.CreateOptions{})
	wantForbidden(t, "a user's migration with a deadline", err, causeMsg)
	m, err := user.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("manual", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a user's plain (Manual) migration: %v", err)
	}
	_, err = user.VirtualMachineInstanceMigrations(ns).Patch(ctx, m.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"lifeboat.dev/cause":"NodePressure"}}}`), metav1.PatchOptions{})
	wantForbidden(t, "a cause added to a user's migration", err, causeMsg)

	saUser, groups := serviceAccountUser(controllerSA)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: saUser, Groups: groups}
	controller := lifeboatclient.NewForConfigOrDie(cfg).LifeboatV1alpha1()
	if _, err := controller.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("evacuation", map[string]string{
		v1alpha1.AnnotationCause: "NodePressure", v1alpha1.AnnotationDeadline: "2026-01-01T00:00:00Z"}), metav1.CreateOptions{}); err != nil {
		t.Errorf("lifeboat's controller recording an evacuation's cause and deadline: %v", err)
	}

	vm := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"}, Spec: v1alpha1.VirtualMachineInstanceSpec{
		Memory: resource.MustParse("128Mi"),
		Boot:   v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel", KernelPath: "/vmlinuz"}},
	}}
	if _, err := user.VirtualMachineInstances(ns).Create(ctx, vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cancel := []byte(`{"metadata":{"annotations":{"lifeboat.dev/cancel-evacuation":"drain abandoned"}}}`)
	waitEnforced(t, "VMIs", cancelMsg, func(ctx context.Context) error {
		_, err := user.VirtualMachineInstances(ns).Patch(ctx, vm.Name, types.MergePatchType, cancel, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	_, err = user.VirtualMachineInstances(ns).Patch(ctx, vm.Name, types.MergePatchType, cancel, metav1.PatchOptions{})
	wantForbidden(t, "an editor cancelling an evacuation", err, cancelMsg)
	canceller := editor(t, ns, "drain-owner", true).LifeboatV1alpha1()
	// The API server's authorizer sees a new RoleBinding a moment after it is stored: wait, with
	// dry runs, until the grant is in force.
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := canceller.VirtualMachineInstances(ns).Patch(ctx, vm.Name, types.MergePatchType, cancel, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if _, err := canceller.VirtualMachineInstances(ns).Patch(ctx, vm.Name, types.MergePatchType, cancel, metav1.PatchOptions{}); err != nil {
		t.Errorf("a holder of lifeboat-evacuation-canceller cancelling: %v", err)
	}
	// Removing the request (as lifeboat does once it is handled) needs no such verb.
	if _, err := user.VirtualMachineInstances(ns).Patch(ctx, vm.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"lifeboat.dev/cancel-evacuation":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("removing a cancel request: %v", err)
	}
}

// Only lifeboat's controller records that a migration is an evacuation's (issue 45, N3): the
// record (status.evacuation) is what makes a migration count against the evacuation limits and in
// its VMI's backoff, so a namespace user who may create and edit migrations must not be able to
// write it, neither with the migration nor after, whatever labels they put on it.
func TestOnlyTheControllerRecordsAnEvacuation(t *testing.T) {
	install(t)
	ctx := context.Background()
	ns := testNamespace(t)
	user := editor(t, ns, "vm-editor", false).LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	record := &v1alpha1.MigrationEvacuation{VMIUID: "uid-of-another-tenants-vm"}
	// lifeboat's labels on it are refused by lifeboat-reserved-metadata
	// (TestOnlyLifeboatLabelsLaunchersAndMigrations); the record is what would count.
	forged := migration("forged", nil)
	forged.Status.Evacuation = record
	var m *v1alpha1.VirtualMachineInstanceMigration
	// The authorizer sees the new RoleBinding a moment after it is stored.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		m, err = user.Create(ctx, forged, metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("a user's migration carrying an evacuation record: %v", err)
	}
	if m.Status.Evacuation != nil {
		t.Errorf("the API server kept the record a user sent with a new migration: %+v", m.Status.Evacuation)
	}
	m.Status.Evacuation = record
	if m, err = user.Update(ctx, m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	} else if m.Status.Evacuation != nil {
		t.Errorf("the API server kept the record a user sent with an update of the migration: %+v", m.Status.Evacuation)
	}
	m.Status.Evacuation = record
	if _, err := user.UpdateStatus(ctx, m, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a user writing the record in the migration's status: %v; want it forbidden", err)
	}

	saUser, groups := serviceAccountUser(controllerSA)
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: saUser, Groups: groups}
	controller := lifeboatclient.NewForConfigOrDie(cfg).LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	if m, err = controller.UpdateStatus(ctx, m, metav1.UpdateOptions{}); err != nil || m.EvacuatedVMI() != types.UID(record.VMIUID) {
		t.Errorf("lifeboat's controller recording an evacuation's migration: %v, %+v", err, m)
	}
}
