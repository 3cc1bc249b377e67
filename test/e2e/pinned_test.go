package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// phantomNode registers a VM node (labelled lifeboat.dev/kvm=true and with labels) that no
// kubelet runs: placement counts it as a node that could take a VM (its unreachable taints are the
// node lifecycle's, which pass), while the scheduler places nothing there. Tests whose VMs must be
// marked and get a migration that waits for a node use it; without it a VM no other node can take
// gets none (issue 44 item 4, NoTargetNode). It is born unreachable, as the node lifecycle
// controller would make it, so that the controller changes nothing the evacuation controller
// watches later (a change there would count as room made).
func phantomNode(t testing.TB, labels map[string]string) string {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "phantom-", Labels: map[string]string{v1alpha1.LabelKVMNode: "true"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
			{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
		}},
	}
	for k, v := range labels {
		n.Labels[k] = v
	}
	unknown := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusNeverUpdated",
		Message: "a phantom node of the e2e tests: no kubelet", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	n.Status.Conditions = unknown
	n, err := cluster.Kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Kube.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	if len(n.Status.Conditions) == 0 {
		n.Status.Conditions = unknown
		if _, err := cluster.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return n.Name
}

// waitLiveMigratable waits until the VMI's LiveMigratable condition has status want (and, for
// False, reason), and returns the VMI.
func waitLiveMigratable(t *testing.T, ns, name string, want metav1.ConditionStatus, reason string, timeout time.Duration) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	return waitVMI(t, ns, name, timeout, fmt.Sprintf("LiveMigratable %s %s", want, reason), func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
		return c != nil && c.Status == want && (reason == "" || c.Reason == reason)
	})
}

// TestADrainOfPinnedVMsSaysSoAtOnce is issue 44 item 4: three VMs pinned to their node by
// nodeSelector (LiveMigrate, LiveMigrateIfPossible, External) on a node that is drained while
// another node, without their label, could take any VM but theirs. Before the drain each says why it cannot leave
// (LiveMigratable=False, NoTargetNode, and an Event). The drain's 429 for the LiveMigrate VM names
// the reason within seconds; the LiveMigrateIfPossible VM's pod is evicted as None's would be and
// its VM shut down (run strategy Once: it stays stopped); the External VM is marked and left to
// its external controller; no migration is created, so none waits in Scheduling.
func TestADrainOfPinnedVMsSaysSoAtOnce(t *testing.T) {
	setConfig(t, false)
	startControllerWithWebhook(t)
	const pinLabel = "e2e.lifeboat.dev/pinned"
	source := startNodes(t, 1, func(c *node.Config) { c.Labels = map[string]string{pinLabel: "yes"} })[0]
	other := startNodes(t, 1)[0]
	ns := testNamespace(t)
	pin := func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{pinLabel: "yes"} }
	lm := createVMI(t, ns, newVMI("pinned-lm", strategy(v1alpha1.EvictionStrategyLiveMigrate), pin))
	ext := createVMI(t, ns, newVMI("pinned-ext", strategy(v1alpha1.EvictionStrategyExternal), pin))
	// The LiveMigrateIfPossible VM belongs to a VM whose run strategy Once leaves it stopped once
	// its guest has shut down.
	vm := newVM("pinned-lmip", v1alpha1.RunStrategyOnce)
	vm.Spec.Template.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrateIfPossible)
	vm.Spec.Template.Spec.NodeSelector = map[string]string{pinLabel: "yes"}
	allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantWhy := "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector " + pinLabel + "=yes"
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{lm.Name, ext.Name, vm.Name} {
		v := waitVMI(t, ns, name, 2*bootTimeout, "phase Running", running)
		waitCounterPast(t, source.consolePath(v), 0, bootTimeout)
		v = waitLiveMigratable(t, ns, name, metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode, 30*time.Second)
		if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c.Message != wantWhy {
			t.Errorf("%s: LiveMigratable says %q, want %q", name, c.Message, wantWhy)
		}
		waitEvent(t, ns, name, evacuate.ReasonNoTargetNode, 10*time.Second)
		pods[name] = launcherPod(t, v)
	}
	// The LiveMigrateIfPossible VM that cannot move has no budget (seed 000), the others have one.
	waitBudget(t, getVMI(t, ns, vm.Name), 0)
	waitBudget(t, getVMI(t, ns, lm.Name), 1)
	waitBudget(t, getVMI(t, ns, ext.Name), 1)
	// kubectl drain retries every 5 s; its output carries the webhook's 429 message.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	start := time.Now()
	drain := exec.CommandContext(ctx, cluster.Binaries.Kubectl, "--kubeconfig", cluster.Kubeconfig, "drain", source.Name(),
		"--ignore-daemonsets", "--delete-emptydir-data", "--timeout=15s")
	out, _ := drain.CombinedOutput()
	t.Logf("kubectl drain (%s):\n%s", time.Since(start).Round(100*time.Millisecond), tail(string(out), 30))
	t.Cleanup(func() { setUnschedulable(t, source.Name(), false) })

	// LiveMigrate: the 429 names why, from the first answer (a direct eviction shows its timing).
	code, msg := evictPod(t, pods[lm.Name], false)
	if code != 429 || !strings.Contains(msg, "cannot be live-migrated (NoTargetNode: "+wantWhy+")") {
		t.Errorf("evicting the LiveMigrate VM's pod: %d %q, want 429 naming %q", code, msg, wantWhy)
	}
	if !strings.Contains(string(out), "NoTargetNode: "+wantWhy) {
		t.Errorf("kubectl drain's output does not name why the LiveMigrate VM cannot leave (%q)", wantWhy)
	}
	if v := getVMI(t, ns, lm.Name); v.MarkedForEvacuation() || !running(v) || v.Status.NodeName != source.Name() {
		t.Errorf("the LiveMigrate VM must run on, unmarked: %s", describe(v))
	}

	// LiveMigrateIfPossible: evicted as None, its guest shut down, and the VM stays stopped.
	waitPodGone(t, pods[vm.Name], 30*time.Second)
	if v := waitVMI(t, ns, vm.Name, time.Minute, "ended", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase.Terminal() }); v.MarkedForEvacuation() {
		t.Errorf("the LiveMigrateIfPossible VM was marked: %s", describe(v))
	}

	// External: marked, left to the external controller, as before.
	waitVMI(t, ns, ext.Name, 10*time.Second, "marked", marked)
	waitEvent(t, ns, ext.Name, evacuate.ReasonLeftToExternal, 10*time.Second)

	// No migration was made, so none waited in Scheduling for the pending timeout.
	list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list.Items {
		t.Errorf("migration %s of %s (%s, %s) was made for a VM no node can take", m.Name, m.Spec.VMIName, m.Status.Phase, m.Status.FailureReason)
	}

	// A node the pinned VMs may go to: the LiveMigrate VM can migrate again, and says so.
	labelNode(t, other.Name(), pinLabel, "yes")
	waitLiveMigratable(t, ns, lm.Name, metav1.ConditionTrue, v1alpha1.VMIReasonMigratable, 10*time.Second)
	waitEvent(t, ns, lm.Name, evacuate.ReasonTargetNodeAvailable, 10*time.Second)
	err = wait.PollUntilContextTimeout(context.Background(), time.Second, 10*time.Second, true, func(context.Context) (bool, error) {
		code, msg = evictPod(t, pods[lm.Name], true)
		return code == 429 && strings.Contains(msg, "Eviction triggered evacuation"), nil
	})
	if err != nil {
		t.Errorf("a dry-run eviction once a node can take the VM: %d %q, want 429 %q", code, msg, "Eviction triggered evacuation")
	}
}
