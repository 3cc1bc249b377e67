package check

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestSnapshotOf(t *testing.T) {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}
	}
	vm := func(name string, rs v1alpha1.RunStrategy, es v1alpha1.EvictionStrategy) v1alpha1.VirtualMachine {
		v := v1alpha1.VirtualMachine{ObjectMeta: meta(name), Spec: v1alpha1.VirtualMachineSpec{RunStrategy: rs}}
		v.Spec.Template.Spec.EvictionStrategy = ptr.To(es)
		return v
	}
	vmi := func(name, node, evacuation string, phase v1alpha1.VirtualMachineInstancePhase) v1alpha1.VirtualMachineInstance {
		v := v1alpha1.VirtualMachineInstance{ObjectMeta: meta(name)}
		v.Status.NodeName, v.Status.EvacuationNodeName, v.Status.Phase = node, evacuation, phase
		return v
	}
	migration := func(name, vmi, target string, phase v1alpha1.VirtualMachineInstanceMigrationPhase) v1alpha1.VirtualMachineInstanceMigration {
		m := v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: meta(name), Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi}}
		m.Status.Phase, m.Status.TargetPod = phase, target
		return m
	}
	pod := func(name string, phase corev1.PodPhase) corev1.Pod {
		return corev1.Pod{ObjectMeta: meta(name), Status: corev1.PodStatus{Phase: phase}}
	}
	budget := func(name string, min int) policyv1.PodDisruptionBudget {
		return policyv1.PodDisruptionBudget{ObjectMeta: meta(name), Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(int32(min)))}}
	}
	eviction := func(name, pod string, state lifecyclev1alpha1.ResponderStateType, completed bool) lifecyclev1alpha1.Eviction {
		ev := lifecyclev1alpha1.Eviction{ObjectMeta: meta(name), Spec: lifecyclev1alpha1.EvictionSpec{
			Target: lifecyclev1alpha1.EvictionTarget{Pod: &lifecyclev1alpha1.EvictionPodReference{Name: pod, UID: types.UID("uid-" + pod)}}}}
		ev.Status.TargetResponders = []lifecyclev1alpha1.TargetResponder{{Name: v1alpha1.EvictionResponderName, State: state}}
		ev.Status.Responders = []lifecyclev1alpha1.ResponderStatus{{Name: v1alpha1.EvictionResponderName}}
		if completed {
			ev.Status.Responders[0].CompletionTime = &metav1.Time{Time: t0}
		}
		return ev
	}
	node := func(name string, cordoned bool) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
	}
	for _, tc := range []struct {
		name      string
		o         Objects
		wantVMs   string
		wantHolds string
	}{{
		name: "a running LiveMigrate VM, a halted one and one without an instance",
		o: Objects{
			VMs: []v1alpha1.VirtualMachine{vm("a", v1alpha1.RunStrategyAlways, v1alpha1.EvictionStrategyLiveMigrate),
				vm("b", v1alpha1.RunStrategyHalted, v1alpha1.EvictionStrategyLiveMigrate), vm("c", v1alpha1.RunStrategyAlways, v1alpha1.EvictionStrategyNone)},
			VMIs: []v1alpha1.VirtualMachineInstance{vmi("a", "n1", "", v1alpha1.VMIRunning)},
		},
		wantVMs:   "[{ns/a uid-a Running n1 true true} {ns/b    true false} {ns/c    false true}]",
		wantHolds: "[]",
	}, {
		name: "a mark, a migration with its pending target pod, an expanded budget, and a cordon nobody asked for",
		o: Objects{
			VMIs:       []v1alpha1.VirtualMachineInstance{vmi("a", "n1", "n1", v1alpha1.VMIRunning), vmi("b", "n2", "n1", v1alpha1.VMIRunning), vmi("c", "n1", "n1", v1alpha1.VMIFailed)},
			Migrations: []v1alpha1.VirtualMachineInstanceMigration{migration("m1", "a", "a-target", v1alpha1.MigrationScheduling), migration("m0", "a", "a-old", v1alpha1.MigrationFailed)},
			Pods:       []corev1.Pod{pod("a-target", corev1.PodPending), pod("a-old", corev1.PodPending), pod("a-source", corev1.PodRunning)},
			Budgets:    []policyv1.PodDisruptionBudget{budget("a", 2), budget("b", 1)},
			Nodes:      []corev1.Node{node("n1", true), node("n2", true), node("n3", false)},
			Cordoned:   map[string]bool{"n1": true},
		},
		wantVMs:   "[]",
		wantHolds: "[{mark ns/a@n1} {migration ns/m1} {target-pod ns/a-target} {budget ns/a} {cordon n2}]",
	}, {
		name: "Evictions: lifeboat's answer awaited while the pod runs; answered, not lifeboat's turn, or the pod ended",
		o: Objects{
			Pods: []corev1.Pod{pod("p1", corev1.PodRunning), pod("p2", corev1.PodRunning), pod("p3", corev1.PodRunning), pod("p4", corev1.PodFailed)},
			Evictions: []lifecyclev1alpha1.Eviction{eviction("e1", "p1", lifecyclev1alpha1.ResponderStateActive, false),
				eviction("e2", "p2", lifecyclev1alpha1.ResponderStateActive, true), eviction("e3", "p3", lifecyclev1alpha1.ResponderStateCompleted, false),
				eviction("e4", "p4", lifecyclev1alpha1.ResponderStateActive, false), eviction("e5", "gone", lifecyclev1alpha1.ResponderStateActive, false)},
		},
		wantVMs:   "[]",
		wantHolds: "[{eviction ns/e1}]",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := SnapshotOf(t0, tc.o)
			if got := fmt.Sprint(s.VMs); got != tc.wantVMs {
				t.Errorf("VMs %s, want %s", got, tc.wantVMs)
			}
			if got := fmt.Sprint(s.Holds); got != tc.wantHolds {
				t.Errorf("holds %s, want %s", got, tc.wantHolds)
			}
		})
	}
}
