package vmi

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestGateOrder(t *testing.T) {
	pod := func(name, node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	onB := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, NodeName: "b"}}
	for _, tc := range []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		pods []*corev1.Pod
		want []string
	}{
		{"the target, where the guest now runs, before the source", onB,
			[]*corev1.Pod{pod("source", "a", corev1.PodRunning), pod("target", "b", corev1.PodRunning)}, []string{"target", "source"}},
		{"already in order", onB,
			[]*corev1.Pod{pod("target", "b", corev1.PodRunning), pod("source", "a", corev1.PodRunning)}, []string{"target", "source"}},
		{"pods the guest is not in keep their order", onB,
			[]*corev1.Pod{pod("old", "a", corev1.PodFailed), pod("done", "b", corev1.PodSucceeded), pod("target", "b", corev1.PodRunning), pod("source", "a", corev1.PodRunning)},
			[]string{"target", "old", "done", "source"}},
		{"a VMI not running: none first", &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIFailed, NodeName: "b"}},
			[]*corev1.Pod{pod("source", "a", corev1.PodRunning), pod("target", "b", corev1.PodRunning)}, []string{"source", "target"}},
		{"no pods", onB, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range GateOrder(tc.vmi, tc.pods) {
				got = append(got, p.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("GateOrder = %v, want %v", got, tc.want)
			}
		})
	}
}
