package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// `kubectl lifeboat status VM` against the real API server, with the objects lifeboat's
// controllers and agents write made for real: it says what protects each VM and what a drain and
// memory pressure would do to it, in the lines a user reads.
func TestStatusSaysWhatProtectsTheVMAndWhatWouldHappen(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "status-")

	config, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Create(ctx, &v1alpha1.LifeboatConfig{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName},
		Spec: v1alpha1.LifeboatConfigSpec{
			FeatureGates:       []v1alpha1.FeatureGate{v1alpha1.FeatureGateNodePressureEvictionLiveMigration},
			EvictionStrategy:   ptr.To(v1alpha1.EvictionStrategyLiveMigrate),
			Migrations:         v1alpha1.MigrationsConfig{BandwidthPerMigration: ptr.To(resource.MustParse("64Mi"))},
			NodePressureRelief: &v1alpha1.NodePressureReliefConfig{Margin: ptr.To(resource.MustParse("1Gi"))},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Delete(ctx, v1alpha1.ConfigName, metav1.DeleteOptions{})
	})
	config.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConfigConditionEvictionWebhookStrict, Status: metav1.ConditionFalse,
		Reason: "NoAuthenticatedCallSeen", Message: "permissive", LastTransitionTime: metav1.Now()},
		{Type: v1alpha1.ConfigConditionReady, Status: metav1.ConditionTrue, Reason: "ControllerReady", Message: "replica a leads", LastTransitionTime: metav1.Now()}}
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().UpdateStatus(ctx, config, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// node-1's agent found a soft threshold with 30 s of grace; relief is off there.
	exposure, _ := json.Marshal(v1alpha1.NodeEvictionExposure{Source: "configz", Threshold: "soft", GraceSeconds: 30, Relief: false,
		Message: "the kubelet's soft memory.available threshold (1Gi) acts first and gives an evicted VM pod 30s"})
	makeNode(t, "status-node-1", map[string]string{v1alpha1.LabelKVMNode: "true", "disk": "ssd"}, string(exposure))
	makeNode(t, "status-node-2", map[string]string{v1alpha1.LabelKVMNode: "true"}, "")

	hook, err := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, controlplane.InertEvictionWebhook("lifeboat-eviction", "status-test"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, hook.Name, metav1.DeleteOptions{})
	})

	// "mover": a 1 GiB VM that takes its strategy from the LifeboatConfig, live-migratable, with its budget.
	makeVM(t, ns, "mover", nil, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})
	if _, err := cluster.Kube.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "lifeboat-mover"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelVMIUID: "none"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out := runStatus(t, ns, "mover")
	for _, want := range []string{
		"Protected by:\n  lifeboat controller: Ready True (ControllerReady)\n",
		"  eviction strategy LiveMigrate, from the LifeboatConfig's spec.evictionStrategy, as the VMI sets none\n",
		"  live migration: possible\n",
		"  other nodes: 1 it may run on (status-node-2)\n",
		"  eviction webhook lifeboat-eviction: registered, permissive (NoAuthenticatedCallSeen): it also acts, within bounds, on reviews it cannot authenticate\n",
		"  disruption budget lifeboat-mover: minAvailable 1, 0 disruption(s) allowed now\n",
		"  feature gate NodePressureEvictionLiveMigration on: a node-pressure eviction becomes an evacuation, as its strategy says\n",
		"  node status-node-1: relief off; the kubelet's soft memory.available threshold (1Gi) acts first and gives an evicted VM pod 30s (its agent, kubelet settings from configz)\n",
		"If its node were drained:\n  live-migrates: the eviction webhook marks it (429 \"Eviction triggered evacuation\", which kubectl drain retries) and it moves; 1 other node(s) fit (status-node-2); the drain ends once it has left\n",
		"If its node ran out of memory:\n  live-migrates: node-pressure relief is off there; if the kubelet evicts it, it live-migrates within the grace: the kubelet's soft memory.available threshold gives its pod 30s, and copying its 1Gi once takes at least 16s at bandwidthPerMigration 64Mi/s\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status of mover lacks %q", want)
		}
	}

	// "pinned": LiveMigrate of its own, a ReadWriteOnce claim, and a nodeSelector only its node matches.
	makeVM(t, ns, "pinned", func(s *v1alpha1.VirtualMachineInstanceSpec) {
		s.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
		s.NodeSelector = map[string]string{"disk": "ssd"}
	}, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: "DisksNotLiveMigratable",
		Message: "persistentVolumeClaim \"data\" is ReadWriteOnce: only one node mounts it at a time"})
	out = runStatus(t, ns, "pinned")
	for _, want := range []string{
		"  eviction strategy LiveMigrate, from the VMI's spec.evictionStrategy\n",
		"  live migration: not possible, DisksNotLiveMigratable: persistentVolumeClaim \"data\" is ReadWriteOnce: only one node mounts it at a time\n",
		"  other nodes: none it may run on, so it cannot leave node status-node-1\n",
		"  disruption budget: none, so an eviction that the webhook lets through (or that comes while it is down) takes the pod\n",
		"If its node were drained:\n  the drain waits: the eviction webhook refuses the eviction (429) for ever, since the VM cannot live-migrate (DisksNotLiveMigratable: persistentVolumeClaim \"data\" is ReadWriteOnce",
		"If its node ran out of memory:\n  shuts down: it cannot live-migrate (DisksNotLiveMigratable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status of pinned lacks %q", want)
		}
	}

	// "stranded": its node stopped answering; the VMI controller says what to do.
	waiting := "node status-node-1 is NotReady (Unknown) since 2026-11-28T12:01:05Z; the VM may still run there, so it is not started elsewhere. " +
		"Once the node is known to be off, taint it: kubectl taint node status-node-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute, or delete the Node"
	makeVM(t, ns, "stranded", nil, metav1.Condition{Type: v1alpha1.VMIConditionNodeLost, Status: metav1.ConditionTrue, Reason: "WaitingForNode", Message: waiting})
	if out := runStatus(t, ns, "stranded"); !strings.Contains(out, "waiting for its node: "+waiting+"\n") {
		t.Errorf("status of stranded does not say it waits for its node, and what to do:\n%s", out)
	}
}

// A namespace user, who may read its VMs but not the nodes, the webhook's configuration or the
// LifeboatConfig, is told what is not known rather than a guess.
func TestStatusSaysWhatANamespaceUserCannotKnow(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "status-user-")
	makeNode(t, "status-user-node", map[string]string{v1alpha1.LabelKVMNode: "true"}, "")
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachines", "virtualmachineinstances", "virtualmachineinstancemigrations"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"get"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "status-user", APIGroup: rbacv1.GroupName}},
		RoleRef:    rbacv1.RoleRef{Kind: "Role", Name: "vm-reader", APIGroup: rbacv1.GroupName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	makeVM(t, ns, "own", func(s *v1alpha1.VirtualMachineInstanceSpec) {
		s.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	},
		metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: "LocalDisk", Message: "boot.disk is a file on the node"})
	makeVM(t, ns, "defaulted", nil, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})
	out := runStatus(t, ns, "own", "--as", "status-user")
	for _, want := range []string{
		"  LifeboatConfig: unknown, cannot read it (",
		"  eviction strategy LiveMigrate, from the VMI's spec.evictionStrategy\n",
		"  other nodes: unknown, cannot list the nodes (",
		"  eviction webhook: unknown, cannot read ValidatingWebhookConfiguration lifeboat-eviction (",
		"  node status-node-1: unknown, cannot read it\n",
		"  feature gate NodePressureEvictionLiveMigration unknown (it is the LifeboatConfig's)\n",
		// Its own strategy and the agent's word decide a drain, whatever else is unknown.
		"If its node were drained:\n  the drain waits: the eviction webhook refuses the eviction (429) for ever, since the VM cannot live-migrate (LocalDisk: boot.disk is a file on the node)",
		"If its node ran out of memory:\n  unknown: the LifeboatConfig cannot be read",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status of own as a namespace user lacks %q", want)
		}
	}
	out = runStatus(t, ns, "defaulted", "--as", "status-user")
	for _, want := range []string{
		"  eviction strategy: unknown, the VMI sets none and the LifeboatConfig's default cannot be read\n",
		"If its node were drained:\n  unknown: the LifeboatConfig cannot be read",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status of defaulted as a namespace user lacks %q", want)
		}
	}
}

func runStatus(t *testing.T, ns, name string, flags ...string) string {
	t.Helper()
	var out strings.Builder
	if err := run(append([]string{"status", name, "-n", ns, "--kubeconfig", cluster.Kubeconfig}, flags...), &out); err != nil {
		t.Fatalf("kubectl lifeboat status %s: %v", name, err)
	}
	t.Logf("kubectl lifeboat status %s -n %s:\n%s", name, ns, out.String())
	return out.String()
}

func makeNode(t *testing.T, name string, labels map[string]string, exposure string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if exposure != "" {
		n.Annotations = map[string]string{v1alpha1.AnnotationEvictionExposure: exposure}
	}
	if _, err := cluster.Kube.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// makeVM makes a VM and its instance, running on status-node-1 with the LiveMigratable
// condition its agent would write.
func makeVM(t *testing.T, ns, name string, tune func(*v1alpha1.VirtualMachineInstanceSpec), migratable metav1.Condition) {
	t.Helper()
	ctx := context.Background()
	spec := v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("1Gi"),
		Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/boot/vmlinuz"}}}
	if tune != nil {
		tune(&spec)
	}
	lb := cluster.Lifeboat.LifeboatV1alpha1()
	vm, err := lb.VirtualMachines(ns).Create(ctx, &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.VirtualMachineSpec{RunStrategy: v1alpha1.RunStrategyAlways, Template: v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: spec}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vm.Status.PrintableStatus, vm.Status.Ready = v1alpha1.PrintableStatusRunning, true
	if _, err := lb.VirtualMachines(ns).UpdateStatus(ctx, vm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vmi, err := lb.VirtualMachineInstances(ns).Create(ctx, &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vm, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachine"))}},
		Spec:       spec,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	migratable.LastTransitionTime = metav1.Now()
	vmi.Status = v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, NodeName: "status-node-1", Conditions: []metav1.Condition{migratable}}
	if _, err := lb.VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
