package manifests

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// agentClient is lifeboat's client with a token of the agent's service account, bound to node
// as the agent pod's token on that node is (nil: bound to nothing).
func agentClient(t *testing.T, node *corev1.Node) lifeboatclient.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = tokenFor(t, agentSA, node)
	return lifeboatclient.NewForConfigOrDie(cfg)
}

// TestAnAgentWritesOnlyWhatBelongsToItsNode tries, with the tokens of three agents against the
// real API server and the shipped policies, every status write an agent makes: each agent may
// write its own node's VMI and the migrations leaving or reaching it, and is refused another
// node's, with a message naming the nodes.
func TestAnAgentWritesOnlyWhatBelongsToItsNode(t *testing.T) {
	install(t)
	ns := testNamespace(t)
	ctx := t.Context()
	nodeA, nodeB, nodeC := createNode(t, "restrict-a"), createNode(t, "restrict-b"), createNode(t, "restrict-c")
	agentA, agentB, agentC := agentClient(t, nodeA), agentClient(t, nodeB), agentClient(t, nodeC)
	admin := cluster.Lifeboat.LifeboatV1alpha1()

	vmi, err := admin.VirtualMachineInstances(ns).Create(ctx, vmiBooting("vm", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmi.Status.NodeName, vmi.Status.Phase = nodeA.Name, v1alpha1.VMIRunning
	vmi.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: "launcher-vm-abcde", UID: "5d1d7c1e-0000-4000-8000-000000000001"}
	// The launcher pod is the controller's to record (lifeboat-launcher-pod-record).
	controller := impersonate(controllerSA)
	if _, err = controller.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mig, err := admin.VirtualMachineInstanceMigrations(ns).Create(ctx, migration("m", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mig.Status.SourceNode, mig.Status.TargetNode, mig.Status.Phase = nodeA.Name, nodeB.Name, v1alpha1.MigrationPreparingTarget
	if _, err = admin.VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, mig, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	writeVMI := func(c lifeboatclient.Interface, dryRun bool, change func(*v1alpha1.VirtualMachineInstance)) error {
		v, err := admin.VirtualMachineInstances(ns).Get(context.Background(), "vm", metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(v)
		opts := metav1.UpdateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = c.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(context.Background(), v, opts)
		return err
	}
	writeMigration := func(c lifeboatclient.Interface, change func(*v1alpha1.VirtualMachineInstanceMigration)) error {
		m, err := admin.VirtualMachineInstanceMigrations(ns).Get(context.Background(), "m", metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(m)
		_, err = c.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).UpdateStatus(context.Background(), m, metav1.UpdateOptions{})
		return err
	}
	mark := func(v *v1alpha1.VirtualMachineInstance) { v.Status.EvacuationNodeName = v.Status.NodeName }
	waitEnforced(t, "node B's agent marking node A's VMI", "the agent of node restrict-b may not write VMI vm", func(ctx context.Context) error { return writeVMI(agentB, true, mark) })

	if err := writeVMI(agentA, false, mark); err != nil {
		t.Errorf("node A's agent marking its own VMI: %v", err)
	}
	wantForbidden(t, "node B's agent marking node A's VMI", writeVMI(agentB, false, mark),
		"the agent of node restrict-b may not write VMI vm: it runs on node restrict-a")
	wantForbidden(t, "node A's agent moving its VMI to node C", writeVMI(agentA, false, func(v *v1alpha1.VirtualMachineInstance) { v.Status.NodeName = nodeC.Name }),
		"the agent of node restrict-a may not move VMI vm to node restrict-c")
	wantForbidden(t, "an agent token bound to no node", writeVMI(agentClient(t, nil), false, mark), "the agent's token names no node")
	wantForbidden(t, "node A's agent naming another pod its VMI's launcher", writeVMI(agentA, false, func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: "lookalike", UID: "5d1d7c1e-0000-4000-8000-000000000002"}
	}), "the agent of node restrict-a may not change the launcher pod of VMI vm")

	ready := func(m *v1alpha1.VirtualMachineInstanceMigration) { m.Status.Phase = v1alpha1.MigrationTargetReady }
	if err := writeMigration(agentB, ready); err != nil {
		t.Errorf("node B's agent, the target, announcing its proxies: %v", err)
	}
	if err := writeMigration(agentA, func(m *v1alpha1.VirtualMachineInstanceMigration) { m.Status.Phase = v1alpha1.MigrationRunning }); err != nil {
		t.Errorf("node A's agent, the source, starting the migration: %v", err)
	}
	wantForbidden(t, "node C's agent failing a migration from A to B", writeMigration(agentC, func(m *v1alpha1.VirtualMachineInstanceMigration) { m.Status.Phase = v1alpha1.MigrationFailed }),
		"the agent of node restrict-c may not write migration m, which goes from node restrict-a to node restrict-b")
	wantForbidden(t, "node A's agent redirecting its migration to node C", writeMigration(agentA, func(m *v1alpha1.VirtualMachineInstanceMigration) { m.Status.TargetNode = nodeC.Name }),
		"the agent of node restrict-a may not change the nodes of migration m")
	wantForbidden(t, "node A's agent recording its migration as an evacuation's", writeMigration(agentA, func(m *v1alpha1.VirtualMachineInstanceMigration) {
		m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: "uid-of-a-vm"}
	}), "the agent of node restrict-a may not change the evacuation record of migration m")
	// A migration made ahead of a free slot: its source agent may write its phase, not give it a slot.
	if err := writeMigration(controller, func(m *v1alpha1.VirtualMachineInstanceMigration) {
		m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: string(vmi.UID), WaitingForSlot: true}
	}); err != nil {
		t.Fatalf("the controller recording the migration as made ahead: %v", err)
	}
	if err := writeMigration(agentA, func(m *v1alpha1.VirtualMachineInstanceMigration) { m.Status.Mode = v1alpha1.MigrationModePreCopy }); err != nil {
		t.Errorf("node A's agent writing a migration made ahead: %v", err)
	}
	wantForbidden(t, "node A's agent giving its migration a slot", writeMigration(agentA, func(m *v1alpha1.VirtualMachineInstanceMigration) {
		m.Status.Evacuation.WaitingForSlot = false
	}), "the agent of node restrict-a may not give migration m a parallel-migration slot")
	wantForbidden(t, "node A's agent having its migration take the slot of another", writeMigration(agentA, func(m *v1alpha1.VirtualMachineInstanceMigration) {
		m.Status.Evacuation.SlotAfterUID = "uid-of-an-ended-migration"
	}), "the agent of node restrict-a may not choose the migration whose slot migration m takes")

	// The migration moves the VMI to node B: B's agent may write it from then on, and A's not.
	if err := writeVMI(agentA, false, func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "m", SourceNode: nodeA.Name, TargetNode: nodeB.Name}
	}); err != nil {
		t.Fatalf("node A's agent recording the migration on its VMI: %v", err)
	}
	if err := writeVMI(agentA, false, func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.NodeName = nodeB.Name
		v.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: "launcher-vm-target", UID: "5d1d7c1e-0000-4000-8000-000000000003"}
	}); err != nil {
		t.Errorf("node A's agent handing its VMI to the migration's target: %v", err)
	}
	wantForbidden(t, "node A's agent writing the VMI after it left", writeVMI(agentA, false, mark), "the agent of node restrict-a may not write VMI vm: it runs on node restrict-b")
	// The target's agent records how long the guest stood still (kubectl lifeboat follow reads it); no other node's may.
	downtime := func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.MigrationState.DowntimeMilliseconds = ptr.To[int64](40)
	}
	if err := writeVMI(agentB, false, downtime); err != nil {
		t.Errorf("node B's agent, the target, recording the guest's downtime: %v", err)
	}
	wantForbidden(t, "node C's agent recording the guest's downtime", writeVMI(agentC, false, downtime), "the agent of node restrict-c may not write VMI vm: it runs on node restrict-b")
}

// TestTheControllerCreatesOnlyLauncherPods uses the controller's token as a thief would: the
// pods it could otherwise create in any namespace (one that mounts a service account token, one
// without a VMI controlling it, a privileged one) are refused; a launcher pod is created.
// TestTheControllersTokenCreatesOnlyWhatALauncherNeeds tries the other escapes.
func TestTheControllerCreatesOnlyLauncherPods(t *testing.T) {
	install(t)
	ns := testNamespace(t)
	ctx := t.Context()
	owner, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, vmiBooting("vm", v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	launcherPod := func(change func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "launcher-vm-", Labels: map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(owner, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}},
			Spec: corev1.PodSpec{AutomountServiceAccountToken: ptr.To(false), SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsGroup: ptr.To[int64](107),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{Name: "compute", Image: "lifeboat.dev/lifeboat-launcher:dev", SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}},
		}
		change(p)
		return p
	}
	controller := tokenClient(t, controllerSA, nil).CoreV1().Pods(ns)
	create := func(ctx context.Context, p *corev1.Pod, dryRun bool) error {
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := controller.Create(ctx, p, opts)
		return err
	}
	tokenPod := launcherPod(func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil })
	waitEnforced(t, "a pod with a service account token", "carries no service account token", func(ctx context.Context) error { return create(ctx, tokenPod, true) })

	if err := create(ctx, launcherPod(func(*corev1.Pod) {}), false); err != nil {
		t.Errorf("the controller creating a launcher pod: %v", err)
	}
	refusals := []struct {
		name, says string
		pod        *corev1.Pod
	}{
		{"a pod that mounts the service account token", "carries no service account token", tokenPod},
		{"a projected token", "carries no service account token", launcherPod(func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}}
		})},
		{"a pod no VMI controls", "controller is its VirtualMachineInstance", launcherPod(func(p *corev1.Pod) { p.OwnerReferences = nil })},
		{"an ordinary pod", "launcher pods only", launcherPod(func(p *corev1.Pod) { p.Labels = nil; p.GenerateName = "miner-" })},
		{"a privileged pod", "not privileged", launcherPod(func(p *corev1.Pod) {
			// The API server refuses privileged with allowPrivilegeEscalation false itself.
			p.Spec.Containers[0].SecurityContext.Privileged, p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true), nil
		})},
		{"the host's PID namespace", "shares no host namespace", launcherPod(func(p *corev1.Pod) { p.Spec.HostPID = true })},
	}
	for _, r := range refusals {
		wantForbidden(t, "the controller creating "+r.name, create(ctx, r.pod, false), r.says)
	}
}

// TestAnAgentChangesOnlyItsNodesReliefLabel: node-pressure relief lets an agent set and remove
// lifeboat.dev/memory-pressure-relief on its own Node, and it publishes what its kubelet's
// eviction settings mean in lifeboat.dev/eviction-exposure; every other node, every other label
// or annotation and the Node's spec are refused with a message saying so.
func TestAnAgentChangesOnlyItsNodesReliefLabel(t *testing.T) {
	install(t)
	nodeA, nodeB := createNode(t, "relief-a"), createNode(t, "relief-b")
	nodeClient := func(node *corev1.Node) kubernetes.Interface {
		cfg := rest.AnonymousClientConfig(cluster.Config)
		cfg.BearerToken = tokenFor(t, agentSA, node)
		return kubernetes.NewForConfigOrDie(cfg)
	}
	agentA := nodeClient(nodeA)
	patch := func(c kubernetes.Interface, node string, change map[string]any, dryRun bool) error {
		b, err := json.Marshal(change)
		if err != nil {
			return err
		}
		opts := metav1.PatchOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, b, opts)
		return err
	}
	label := func(key string, value any) map[string]any {
		return map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}}
	}
	waitEnforced(t, "node A's agent labelling node B", "the agent of node relief-a may not write node relief-b", func(context.Context) error {
		return patch(agentA, nodeB.Name, label(v1alpha1.LabelMemoryPressureRelief, "true"), true)
	})

	if err := patch(agentA, nodeA.Name, label(v1alpha1.LabelMemoryPressureRelief, "true"), false); err != nil {
		t.Errorf("node A's agent setting its node's relief label: %v", err)
	}
	if n, err := cluster.Kube.CoreV1().Nodes().Get(t.Context(), nodeA.Name, metav1.GetOptions{}); err != nil || n.Labels[v1alpha1.LabelMemoryPressureRelief] != "true" {
		t.Errorf("node A after its agent labelled it: %v, labels %v", err, n.Labels)
	}
	if err := patch(agentA, nodeA.Name, label(v1alpha1.LabelMemoryPressureRelief, nil), false); err != nil {
		t.Errorf("node A's agent removing its node's relief label: %v", err)
	}
	wantForbidden(t, "node A's agent labelling node B", patch(agentA, nodeB.Name, label(v1alpha1.LabelMemoryPressureRelief, "true"), false),
		"the agent of node relief-a may not write node relief-b")
	annotation := func(key string, value any) map[string]any {
		return map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}}
	}
	if err := patch(agentA, nodeA.Name, annotation(v1alpha1.AnnotationEvictionExposure, `{"atRisk":true}`), false); err != nil {
		t.Errorf("node A's agent publishing its node's eviction exposure: %v", err)
	}
	wantForbidden(t, "node A's agent annotating node B", patch(agentA, nodeB.Name, annotation(v1alpha1.AnnotationEvictionExposure, `{}`), false),
		"the agent of node relief-a may not write node relief-b")
	only := "the agent of node relief-a may change only the label lifeboat.dev/memory-pressure-relief and the annotation lifeboat.dev/eviction-exposure of its node"
	wantForbidden(t, "node A's agent setting another annotation on its node", patch(agentA, nodeA.Name, annotation("example.com/other", "x"), false), only)
	wantForbidden(t, "node A's agent setting another label on its node", patch(agentA, nodeA.Name, label(v1alpha1.LabelKVMNode, "true"), false), only)
	wantForbidden(t, "node A's agent cordoning its node", patch(agentA, nodeA.Name, map[string]any{"spec": map[string]any{"unschedulable": true}}, false), only)
	wantForbidden(t, "an agent token bound to no node", patch(nodeClient(nil), nodeA.Name, label(v1alpha1.LabelMemoryPressureRelief, "true"), false),
		"the agent's token names no node")
}

// TestAKubeletCannotUnmarkItsVMNode: the controller and the signer keep off nodes labelled
// lifeboat.dev/kvm=true, so a VM node's kubelet (impersonated, as the Node authorizer knows it)
// that could remove the label would draw them onto itself. It is refused removing or changing
// the label, through nodes and nodes/status, and another node's kubelet adding it; the same
// kubelet's heartbeat and other labels pass, and an admin adds and removes the label.
func TestAKubeletCannotUnmarkItsVMNode(t *testing.T) {
	install(t)
	ctx := t.Context()
	vmNode, plainNode := createNode(t, "kubelet-vm"), createNode(t, "kubelet-plain")
	kubelet := func(node *corev1.Node) kubernetes.Interface {
		cfg := rest.CopyConfig(cluster.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node.Name, Groups: []string{"system:nodes"}}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	vmKubelet, plainKubelet := kubelet(vmNode), kubelet(plainNode)
	admin := cluster.Kube
	patch := func(c kubernetes.Interface, node string, change map[string]any, dryRun bool, subresources ...string) error {
		b, err := json.Marshal(change)
		if err != nil {
			return err
		}
		opts := metav1.PatchOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, b, opts, subresources...)
		return err
	}
	label := func(key string, value any) map[string]any {
		return map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}}
	}
	kvmLabel := func(n string) string {
		got, err := admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := got.Labels[v1alpha1.LabelKVMNode]
		if !ok {
			return "(none)"
		}
		return v
	}

	if err := patch(admin, vmNode.Name, label(v1alpha1.LabelKVMNode, "true"), false); err != nil {
		t.Fatalf("an admin marking a VM node: %v", err)
	}
	says := func(node, verb string) string {
		return "the kubelet system:node:" + node + " may not " + verb + " the label lifeboat.dev/kvm of node " + node + ": an admin sets it"
	}
	waitEnforced(t, "a VM node's kubelet removing its lifeboat.dev/kvm", says(vmNode.Name, "remove"), func(context.Context) error {
		return patch(vmKubelet, vmNode.Name, label(v1alpha1.LabelKVMNode, nil), true)
	})

	wantForbidden(t, "a VM node's kubelet removing its lifeboat.dev/kvm", patch(vmKubelet, vmNode.Name, label(v1alpha1.LabelKVMNode, nil), false), says(vmNode.Name, "remove"))
	wantForbidden(t, "a VM node's kubelet setting its lifeboat.dev/kvm to false", patch(vmKubelet, vmNode.Name, label(v1alpha1.LabelKVMNode, "false"), false), says(vmNode.Name, "change"))
	wantForbidden(t, "a VM node's kubelet removing its lifeboat.dev/kvm through nodes/status",
		patch(vmKubelet, vmNode.Name, label(v1alpha1.LabelKVMNode, nil), false, "status"), says(vmNode.Name, "remove"))
	wantForbidden(t, "a kubelet marking its node a VM node", patch(plainKubelet, plainNode.Name, label(v1alpha1.LabelKVMNode, "true"), false), says(plainNode.Name, "add"))
	if got := kvmLabel(vmNode.Name); got != "true" {
		t.Errorf("the VM node's lifeboat.dev/kvm after its kubelet's tries: %s, want true", got)
	}
	if got := kvmLabel(plainNode.Name); got != "(none)" {
		t.Errorf("the other node's lifeboat.dev/kvm after its kubelet's try: %s, want none", got)
	}

	// What a kubelet writes of its Node every few seconds, and a label of its own.
	heartbeat := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
		"lastHeartbeatTime": time.Now().UTC().Format(time.RFC3339), "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}}}
	if err := patch(vmKubelet, vmNode.Name, heartbeat, false, "status"); err != nil {
		t.Errorf("a VM node's kubelet posting its heartbeat: %v", err)
	}
	if err := patch(vmKubelet, vmNode.Name, label("example.com/rack", "r1"), false); err != nil {
		t.Errorf("a VM node's kubelet setting another label: %v", err)
	}
	if err := patch(vmKubelet, vmNode.Name, label("example.com/rack", nil), false); err != nil {
		t.Errorf("a VM node's kubelet removing another label: %v", err)
	}

	if err := patch(admin, vmNode.Name, label(v1alpha1.LabelKVMNode, nil), false); err != nil {
		t.Errorf("an admin unmarking a VM node: %v", err)
	}
	if err := patch(admin, plainNode.Name, label(v1alpha1.LabelKVMNode, "true"), false); err != nil {
		t.Errorf("an admin marking a node a VM node: %v", err)
	}
	if got := kvmLabel(vmNode.Name) + " " + kvmLabel(plainNode.Name); got != "(none) true" {
		t.Errorf("the nodes' lifeboat.dev/kvm after the admin's changes: %s, want (none) true", got)
	}
}
