package manifests

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestOnlyLifeboatLabelsLaunchersAndMigrations: a tenant who may create and edit pods and
// migrations in its namespace cannot make a pod look like a VM's launcher (lifeboat.dev/role,
// lifeboat.dev/vmi-uid), nor put lifeboat.dev/ labels or annotations on a pod or a migration,
// nor add, change or remove them later; neither can a cluster admin's own requests. Its pods
// and migrations without them are admitted and may be edited, and lifeboat's controller labels
// its launcher pods.
func TestOnlyLifeboatLabelsLaunchersAndMigrations(t *testing.T) {
	install(t)
	ctx := t.Context()
	ns := testNamespace(t)
	const says = "lifeboat.dev/ labels and annotations on pods and migrations are lifeboat's"
	kube, lb := tenant(t, ns, "pod-editor")
	pods, migrations := kube.CoreV1().Pods(ns), lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	lookalike := func(name string, labels, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
			Spec:       corev1.PodSpec{AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "c", Image: "example.org/anything:1"}}},
		}
	}
	launcherLabels := map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIUID: "3f0c6a8e-0000-4000-8000-000000000001"}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	waitEnforced(t, "pods", says, func(ctx context.Context) error {
		_, err := pods.Create(ctx, lookalike("probe", launcherLabels, nil), dryRun)
		return err
	})

	for _, r := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"a look-alike launcher pod (lifeboat.dev/role=launcher, lifeboat.dev/vmi-uid=<victim>)", lookalike("lookalike", launcherLabels, nil)},
		{"a pod claiming a VMI by lifeboat.dev/vmi-uid alone", lookalike("vmi-uid", map[string]string{v1alpha1.LabelVMIUID: "x"}, nil)},
		{"a pod with a lifeboat.dev/ annotation", lookalike("annotated", nil, map[string]string{"lifeboat.dev/anything": "x"})},
	} {
		_, err := pods.Create(ctx, r.pod, metav1.CreateOptions{})
		wantForbidden(t, "a tenant creating "+r.name, err, says)
		_, err = cluster.Kube.CoreV1().Pods(ns).Create(ctx, r.pod, metav1.CreateOptions{})
		wantForbidden(t, "a cluster admin creating "+r.name, err, says)
	}

	plain, err := pods.Create(ctx, lookalike("plain", map[string]string{"app": "web"}, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a tenant's pod without lifeboat.dev/ labels: %v", err)
	}
	patch := func(name, body string) error {
		_, err := pods.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	if err := patch(plain.Name, `{"metadata":{"labels":{"app":"db"}}}`); err != nil {
		t.Errorf("a tenant changing its pod's own label: %v", err)
	}
	wantForbidden(t, "a tenant labelling its pod as a launcher",
		patch(plain.Name, `{"metadata":{"labels":{"lifeboat.dev/role":"launcher","lifeboat.dev/vmi-uid":"x"}}}`), says)

	// lifeboat's controller labels its launcher pods; a tenant may neither change nor remove that.
	owner, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, vmiBooting("vm", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	launcher := lookalike("launcher-vm-abcde", map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIUID: string(owner.UID)}, nil)
	launcher.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
	// As unprivileged as lifeboat-controller-pods holds the controller's pods to.
	launcher.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsGroup: ptr.To[int64](107),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	launcher.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	launcher, err = tokenClient(t, controllerSA, nil).CoreV1().Pods(ns).Create(ctx, launcher, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("lifeboat's controller creating a labelled launcher pod: %v", err)
	}
	wantForbidden(t, "a tenant pointing the controller's launcher pod at another VMI",
		patch(launcher.Name, `{"metadata":{"labels":{"lifeboat.dev/vmi-uid":"x"}}}`), says)
	wantForbidden(t, "a tenant removing the controller's launcher pod's role",
		patch(launcher.Name, `{"metadata":{"labels":{"lifeboat.dev/role":null}}}`), says)
	if err := patch(launcher.Name, `{"metadata":{"labels":{"team":"a"}}}`); err != nil {
		t.Errorf("a tenant adding a label of its own to a launcher pod: %v", err)
	}

	for _, r := range []struct{ name, key string }{
		{"naming a VMI by lifeboat.dev/vmi-uid", v1alpha1.LabelVMIUID},
		{"posing as an evacuation (lifeboat.dev/evacuation)", v1alpha1.LabelEvacuation},
	} {
		m := migration("forged-"+r.key[len("lifeboat.dev/"):], nil)
		m.Labels = map[string]string{r.key: "true"}
		_, err := migrations.Create(ctx, m, metav1.CreateOptions{})
		wantForbidden(t, "a tenant's migration "+r.name, err, says)
	}
	m, err := migrations.Create(ctx, migration("manual", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a tenant's plain (Manual) migration: %v", err)
	}
	_, err = migrations.Patch(ctx, m.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"lifeboat.dev/evacuation":"true"}}}`), metav1.PatchOptions{})
	wantForbidden(t, "a tenant labelling its migration as an evacuation", err, says)
}

// tenant is a namespace user with every ordinary verb on pods and migrations in ns.
func tenant(t *testing.T, ns, user string) (kubernetes.Interface, lifeboatclient.Interface) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachineinstancemigrations"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	}}
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	kube, lb := kubernetes.NewForConfigOrDie(cfg), lifeboatclient.NewForConfigOrDie(cfg)
	// The authorizer sees a new RoleBinding a moment after it is stored.
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	return kube, lb
}

// TestAStatusWriterCannotSetLifeboatLabels: a pod's status subresource keeps the labels and
// annotations a write sends, so a user who may only update pods' status (as a node's or an
// operator's account may) cannot set lifeboat.dev/ ones through it either; a migration's status
// subresource keeps none of them, whoever writes it.
func TestAStatusWriterCannotSetLifeboatLabels(t *testing.T) {
	install(t)
	ctx := t.Context()
	ns := testNamespace(t)
	const (
		user = "status-writer"
		says = "lifeboat.dev/ labels and annotations on pods and migrations are lifeboat's"
	)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"update", "patch"}},
		{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachineinstancemigrations"}, Verbs: []string{"get"}},
		{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachineinstancemigrations/status"}, Verbs: []string{"update", "patch"}},
	}}
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	pods := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(ns)
	migrations := lifeboatclient.NewForConfigOrDie(cfg).LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)

	pod, err := cluster.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.org/web:1"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patchStatus := func(ctx context.Context, body string, opts metav1.PatchOptions) error {
		_, err := pods.Patch(ctx, pod.Name, types.MergePatchType, []byte(body), opts, "status")
		return err
	}
	launcherLabels := `{"metadata":{"labels":{"lifeboat.dev/role":"launcher","lifeboat.dev/vmi-uid":"3f0c6a8e-0000-4000-8000-000000000001"}}}`
	waitEnforced(t, "pods/status", says, func(ctx context.Context) error {
		return patchStatus(ctx, launcherLabels, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	})
	wantForbidden(t, "a status writer labelling a pod as a launcher through its status", patchStatus(ctx, launcherLabels, metav1.PatchOptions{}), says)
	wantForbidden(t, "a status writer annotating a pod lifeboat.dev/ through its status",
		patchStatus(ctx, `{"metadata":{"annotations":{"lifeboat.dev/anything":"x"}}}`, metav1.PatchOptions{}), says)
	if err := patchStatus(ctx, `{"metadata":{"labels":{"app":"web"}}}`, metav1.PatchOptions{}); err != nil {
		t.Errorf("a status writer's other label through the status: %v", err)
	}
	got, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Labels[v1alpha1.LabelRole]; ok || got.Labels["app"] != "web" {
		t.Errorf("the pod's labels after the status writes: %v; want app=web and no %s", got.Labels, v1alpha1.LabelRole)
	}

	m, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Create(ctx, migration("manual", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.Labels = map[string]string{v1alpha1.LabelEvacuation: "true"}
	m, err = migrations.UpdateStatus(ctx, m, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("a status writer's write of a migration's status: %v", err)
	}
	if _, ok := m.Labels[v1alpha1.LabelEvacuation]; ok {
		t.Errorf("a migration's status write kept the label %s it sent: %v", v1alpha1.LabelEvacuation, m.Labels)
	}
}
