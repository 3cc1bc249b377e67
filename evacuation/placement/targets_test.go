package placement

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipkg "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

func node(name string, kvm bool, labels ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if kvm {
		n.Labels[v1alpha1.LabelKVMNode] = "true"
	}
	for i := 0; i+1 < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

func pointers(nodes []corev1.Node) []*corev1.Node {
	out := make([]*corev1.Node, len(nodes))
	for i := range nodes {
		out[i] = &nodes[i]
	}
	return out
}

func vm(ns, name, node, memory string, mutate ...func(*v1alpha1.VirtualMachineInstance)) v1alpha1.VirtualMachineInstance {
	v := v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:   v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse(memory)},
		Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: node, Phase: v1alpha1.VMIRunning}}
	for _, m := range mutate {
		m(&v)
	}
	return v
}

func TestTargetNodes(t *testing.T) {
	// A VM on node-1 with 1Gi of guest memory: its pod requests 1Gi and about 180Mi.
	running := func(mutate ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
		v := vm("ns", "db", "node-1", "1Gi", mutate...)
		return &v
	}
	pinnedTo := func(host string) func(*v1alpha1.VirtualMachineInstance) {
		return func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.NodeSelector = map[string]string{corev1.LabelHostname: host}
		}
	}
	vmNode := func(name string, mutate ...func(*corev1.Node)) corev1.Node {
		n := node(name, true, corev1.LabelHostname, name)
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}
		for _, m := range mutate {
			m(&n)
		}
		return n
	}
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	taint := func(key, value string, effect corev1.TaintEffect) func(*corev1.Node) {
		return func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: effect})
		}
	}
	memory := func(q string) func(*corev1.Node) {
		return func(n *corev1.Node) { n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse(q) }
	}
	label := func(k, v string) func(*corev1.Node) { return func(n *corev1.Node) { n.Labels[k] = v } }
	notVM := func(n *corev1.Node) { delete(n.Labels, v1alpha1.LabelKVMNode) }

	for _, tc := range []struct {
		name  string
		vmi   *v1alpha1.VirtualMachineInstance
		nodes []corev1.Node
		fit   []string
		why   string
	}{
		{"another VM node fits", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2")}, []string{"node-2"}, ""},
		{"pinned by its nodeSelector", running(pinnedTo("node-1")), []corev1.Node{vmNode("node-1"), vmNode("node-2"), vmNode("node-3")}, nil,
			"no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=node-1"},
		{"alone in the cluster", running(), []corev1.Node{vmNode("node-1")}, nil, "no node other than node-1 is labelled lifeboat.dev/kvm=true"},
		{"the only other node runs no VMs", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", notVM)}, nil, "no node other than node-1 is labelled lifeboat.dev/kvm=true"},
		{"cordoned and tainted", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", cordoned), vmNode("node-3", taint("dedicated", "db", corev1.TaintEffectNoSchedule))}, nil,
			"no other node can take it: node-2 is cordoned; node-3 has taint dedicated=db:NoSchedule, which the VM does not tolerate"},
		{"a PreferNoSchedule taint does not keep it out", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", taint("soft", "", corev1.TaintEffectPreferNoSchedule))}, []string{"node-2"}, ""},
		{"a NoExecute taint does", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", taint("maintenance", "", corev1.TaintEffectNoExecute))}, nil,
			"no other node can take it: node-2 has taint maintenance:NoExecute, which the VM does not tolerate"},
		{"the node lifecycle's passing taints do not: the node counts", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2",
			taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoSchedule), taint(corev1.TaintNodeUnreachable, "", corev1.TaintEffectNoExecute))}, []string{"node-2"}, ""},
		{"a cordon's taint does", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", taint(corev1.TaintNodeUnschedulable, "", corev1.TaintEffectNoSchedule))}, nil,
			"no other node can take it: node-2 has taint node.kubernetes.io/unschedulable:NoSchedule, which the VM does not tolerate"},
		{"too little allocatable memory", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", memory("1Gi"))}, nil,
			"no other node can take it: node-2 has 1Gi allocatable memory, less than the 1206Mi its pod requests"},
		{"short of memory now (relief): it passes, the node counts", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", label(v1alpha1.LabelMemoryPressureRelief, "true"))}, []string{"node-2"}, ""},
		{"many cordoned nodes are counted", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", cordoned), vmNode("node-3", cordoned), vmNode("node-4", cordoned), vmNode("node-5", cordoned)}, nil,
			"no other node can take it: node-2, node-3, node-4 and 1 more are cordoned"},
		{"a selector and a cordon", running(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{"disk": "ssd"} }),
			[]corev1.Node{vmNode("node-1", label("disk", "ssd")), vmNode("node-2", label("disk", "ssd"), cordoned), vmNode("node-3")}, nil,
			"no other node can take it: node-2 is cordoned; node-3 does not match its nodeSelector disk=ssd"},
		{"one of several fits", running(), []corev1.Node{vmNode("node-1"), vmNode("node-2", cordoned), vmNode("node-3")}, []string{"node-3"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fit, why := TargetNodes(vmipkg.TargetPlacement(tc.vmi), tc.vmi.Status.NodeName, pointers(tc.nodes))
			if !slices.Equal(fit, tc.fit) || why != tc.why {
				t.Errorf("got %v %q\nwant %v %q", fit, why, tc.fit, tc.why)
			}
			if got := NoTargetNode(tc.vmi, pointers(tc.nodes)); got != tc.why {
				t.Errorf("NoTargetNode %q, want %q", got, tc.why)
			}
		})
	}
}

// TestTargetNodesHeedsTheTargetPodsAffinity: a real target pod (NewTargetPod) keeps off its
// source by affinity; any required term of the pod counts.
func TestTargetNodesHeedsTheTargetPodsAffinity(t *testing.T) {
	v := vm("ns", "db", "node-1", "1Gi")
	pod := vmipkg.TargetPlacement(&v)
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	terms[0].MatchExpressions = append(terms[0].MatchExpressions, corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"east"}})
	nodes := []corev1.Node{node("node-1", true, "zone", "east"), node("node-2", true, "zone", "west")}
	fit, why := TargetNodes(pod, "node-1", pointers(nodes))
	if len(fit) != 0 || why != "no other node can take it: node-2 is excluded by its target pod's node affinity" {
		t.Errorf("got %v %q", fit, why)
	}
	nodes = append(nodes, node("node-3", true, "zone", "east"))
	if fit, why := TargetNodes(pod, "node-1", pointers(nodes)); !slices.Equal(fit, []string{"node-3"}) || why != "" {
		t.Errorf("got %v %q, want node-3", fit, why)
	}
}

// A target pod kept off the nodes where the VM's last target never became ready (vmipkg.KeepOff)
// fits only the others, by node name whatever the nodes' labels.
func TestATargetKeptOffNodesFitsOnlyTheOthers(t *testing.T) {
	v := vm("ns", "soak-2", "node-1", "128Mi")
	nodes := []corev1.Node{node("node-1", true), node("node-2", true), node("node-3", true)}
	pod := vmipkg.TargetPlacement(&v)
	if fit, _ := TargetNodes(pod, "node-1", pointers(nodes)); !slices.Equal(fit, []string{"node-2", "node-3"}) {
		t.Fatalf("before: fit %v, want node-2 and node-3", fit)
	}
	vmipkg.KeepOff(pod, []string{"node-2"})
	if fit, why := TargetNodes(pod, "node-1", pointers(nodes)); !slices.Equal(fit, []string{"node-3"}) {
		t.Errorf("kept off node-2: fit %v (%s), want node-3 only", fit, why)
	}
	vmipkg.KeepOff(pod, []string{"node-3"})
	if fit, why := TargetNodes(pod, "node-1", pointers(nodes)); len(fit) != 0 || why != "no other node can take it: node-2, node-3 are excluded by its target pod's node affinity" {
		t.Errorf("kept off both: fit %v, why %q", fit, why)
	}
}
