package evacuate

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/placement"
)

func vmNode(name string, mutate ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelKVMNode: "true", corev1.LabelHostname: name}}}
	for _, m := range mutate {
		m(n)
	}
	return n
}

func pinnedTo(node string) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
}

func withCondition(status metav1.ConditionStatus, reason, message string) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) {
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: status, Reason: reason, Message: message})
	}
}

func TestPlacerCondition(t *testing.T) {
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	two := []*corev1.Node{vmNode("n1"), vmNode("n2")}
	const pinnedMsg = "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=n1"
	migrating := func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "m", SourceNode: "n1", TargetNode: "n2"}
	}
	for _, tc := range []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		nodes  []*corev1.Node
		status metav1.ConditionStatus // "": leave the condition
		reason string
		says   string
	}{
		{"free to move: left True", markedVMI("a", "n1", "Drain", 0), two, "", "", ""},
		{"pinned by its nodeSelector: False, NoTargetNode, naming it", markedVMI("a", "n1", "Drain", 0, pinnedTo("n1")), two, metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode, pinnedMsg},
		{"the other node cordoned", markedVMI("a", "n1", "Drain", 0), []*corev1.Node{vmNode("n1"), vmNode("n2", cordoned)}, metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode,
			"no other node can take it: n2 is cordoned"},
		{"already said: left", markedVMI("a", "n1", "Drain", 0, pinnedTo("n1"), withCondition(metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode, pinnedMsg)), two, "", "", ""},
		{"a node can take it again: True", markedVMI("a", "n1", "Drain", 0, withCondition(metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode, pinnedMsg)), two, metav1.ConditionTrue, v1alpha1.VMIReasonMigratable, ""},
		{"the reason changed: the message follows", markedVMI("a", "n1", "Drain", 0, withCondition(metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode, pinnedMsg)),
			[]*corev1.Node{vmNode("n1"), vmNode("n2", cordoned)}, metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode, "n2 is cordoned"},
		{"the agent's own reason is the agent's", markedVMI("a", "n1", "Drain", 0, pinnedTo("n1"), notMigratable), two, "", "", ""},
		{"no word from the agent yet: left", markedVMI("a", "n1", "Drain", 0, pinnedTo("n1"), func(v *v1alpha1.VirtualMachineInstance) {
			meta.RemoveStatusCondition(&v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
		}), two, "", "", ""},
		{"its own node not in view: the nodes are not known, left", markedVMI("a", "n1", "Drain", 0, pinnedTo("n1")), []*corev1.Node{vmNode("n2")}, "", "", ""},
		{"not running: left", markedVMI("a", "n1", "Drain", 0, pinnedTo("n1"), func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMIScheduled }), two, "", "", ""},
		{"a migration whose target runs is not undone", markedVMI("a", "n1", "Drain", 0, migrating), []*corev1.Node{vmNode("n1"), vmNode("n2", cordoned)}, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := placement.NewPlacer(tc.nodes).Condition(tc.vmi, metav1.NewTime(now))
			switch {
			case tc.status == "" && got != nil:
				t.Errorf("got %+v, want the condition left", got)
			case tc.status == "":
			case got == nil:
				t.Errorf("left the condition, want %s %s", tc.status, tc.reason)
			case got.Status != tc.status || got.Reason != tc.reason || !strings.Contains(got.Message, tc.says) || (tc.says == "" && got.Message != ""):
				t.Errorf("got %s %s %q, want %s %s %q", got.Status, got.Reason, got.Message, tc.status, tc.reason, tc.says)
			}
		})
	}
}

// TestNoMigrationForAVMNoNodeCanTake: a marked VM pinned to its node gets the NoTargetNode
// condition and an Event, and no migration that could only wait out its pending timeout; once a
// node can take it, it is migratable again and gets its migration.
func TestNoMigrationForAVMNoNodeCanTake(t *testing.T) {
	v := markedVMI("a", "n1", "Drain", 0, func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{"disk": "ssd"} })
	client := lifeboatfake.NewSimpleClientset(v)
	factory := lifeboatinformers.NewSharedInformerFactory(client, 0)
	vmiInformer := factory.Lifeboat().V1alpha1().VirtualMachineInstances()
	_ = vmiInformer.Informer().GetIndexer().Add(v)
	nodes, pods := NewCapacityInformers(kubefake.NewClientset())
	_ = nodes.GetIndexer().Add(vmNode("n1", func(n *corev1.Node) { n.Labels["disk"] = "ssd" }))
	_ = nodes.GetIndexer().Add(vmNode("n2"))
	recorder := record.NewFakeRecorder(10)
	c := New(client, vmiInformer, factory.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations(), factory.Lifeboat().V1alpha1().LifeboatConfigs(),
		nodes, pods, recorder, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()

	if _, err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	migrations := func() int {
		list, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	if n := migrations(); n != 0 {
		t.Fatalf("%d migration(s) created for a VM no node can take", n)
	}
	stored, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(stored.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.VMIReasonNoTargetNode || cond.Message != "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector disk=ssd" {
		t.Fatalf("LiveMigratable %+v, want False NoTargetNode naming the selector", cond)
	}
	if e := <-recorder.Events; !strings.Contains(e, "Warning "+ReasonNoTargetNode) || !strings.Contains(e, "disk=ssd") {
		t.Errorf("event %q, want a Warning %s naming the selector", e, ReasonNoTargetNode)
	}

	// A node labelled disk=ssd comes.
	_ = vmiInformer.Informer().GetIndexer().Update(stored)
	_ = nodes.GetIndexer().Add(vmNode("n3", func(n *corev1.Node) { n.Labels["disk"] = "ssd" }))
	if _, err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	stored, err = client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := stored.LiveMigratable(); !ok {
		t.Errorf("not migratable (%s) once node n3 can take it", why)
	}
	if e := <-recorder.Events; !strings.Contains(e, "Normal "+ReasonTargetNodeAvailable) {
		t.Errorf("event %q, want a Normal %s", e, ReasonTargetNodeAvailable)
	}
	if n := migrations(); n != 1 {
		t.Errorf("%d migration(s) once a node can take the VM, want 1", n)
	}
}
