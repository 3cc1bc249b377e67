package vmi

import (
	"slices"
	"testing"
	"time"

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

func TestStillReadyWithoutGuest(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	onB := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, NodeName: "b"}}
	// pod is a launcher pod on node, its gate at gate since gateFor ago, its Ready condition ready.
	// The gate's time is recorded as the API keeps it, truncated to the whole second.
	pod := func(node string, gate corev1.ConditionStatus, gateFor time.Duration, ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{
			Spec: corev1.PodSpec{NodeName: node, ReadinessGates: []corev1.PodReadinessGate{{ConditionType: v1alpha1.PodConditionGuestRunning}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
				{Type: v1alpha1.PodConditionGuestRunning, Status: gate, LastTransitionTime: metav1.NewTime(now.Add(-gateFor).Truncate(time.Second))},
				{Type: corev1.PodReady, Status: ready},
			}},
		}
	}
	with := func(p *corev1.Pod, change func(*corev1.Pod)) *corev1.Pod { change(p); return p }
	for _, tc := range []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		pod    *corev1.Pod
		remove bool
		wait   time.Duration
	}{
		{"the kubelet keeps the source Ready past the bound (it is evicting it)", onB,
			pod("a", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), true, 0},
		{"the gate just went False: the kubelet may still follow", onB,
			pod("a", corev1.ConditionFalse, 0, corev1.ConditionTrue), false, KubeletFollowsGateWithin + time.Second},
		{"the gate went False a second ago", onB,
			pod("a", corev1.ConditionFalse, time.Second, corev1.ConditionTrue), false, KubeletFollowsGateWithin},
		{"the gate went False 2.9 s ago, recorded 3 s ago: the bound has not passed", onB,
			pod("a", corev1.ConditionFalse, 2900*time.Millisecond, corev1.ConditionTrue), false, time.Second},
		{"the gate recorded as False the bound ago: it may have gone False up to a second later", onB,
			pod("a", corev1.ConditionFalse, KubeletFollowsGateWithin, corev1.ConditionTrue), false, time.Second},
		{"the gate went False 3.1 s ago, recorded 4 s ago: the bound has passed", onB,
			pod("a", corev1.ConditionFalse, 3100*time.Millisecond, corev1.ConditionTrue), true, 0},
		{"the gate recorded as False the bound and a second ago", onB,
			pod("a", corev1.ConditionFalse, KubeletFollowsGateWithin+time.Second, corev1.ConditionTrue), true, 0},
		{"the kubelet followed the gate", onB,
			pod("a", corev1.ConditionFalse, time.Minute, corev1.ConditionFalse), false, 0},
		{"the gate not written False yet", onB,
			pod("a", corev1.ConditionTrue, time.Minute, corev1.ConditionTrue), false, 0},
		{"the pod the guest runs in", onB,
			pod("b", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), false, 0},
		{"already being deleted", onB,
			with(pod("a", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: now} }), false, 0},
		{"ended", onB,
			with(pod("a", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), false, 0},
		{"no readiness gate: not on the pod network", onB,
			with(pod("a", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), func(p *corev1.Pod) { p.Spec.ReadinessGates = nil }), false, 0},
		{"not scheduled", onB,
			pod("", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), false, 0},
		{"the VMI not running: no guest anywhere to leave for", &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIFailed, NodeName: "b"}},
			pod("a", corev1.ConditionFalse, time.Minute, corev1.ConditionTrue), false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			remove, wait := StillReadyWithoutGuest(tc.vmi, tc.pod, now)
			if remove != tc.remove || wait != tc.wait {
				t.Errorf("StillReadyWithoutGuest = %t %s, want %t %s", remove, wait, tc.remove, tc.wait)
			}
		})
	}
}

func TestHoldSourceGate(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	onB := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, NodeName: "b"}}
	// pod is a launcher pod on node with its gate at gate since gateFor ago ("" for not
	// written) and its Ready condition ready ("" for none). The API keeps the gate's time in whole
	// seconds, as here: it may have changed up to a second later.
	pod := func(name, node string, gate corev1.ConditionStatus, gateFor time.Duration, ready corev1.ConditionStatus) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: node, ReadinessGates: []corev1.PodReadinessGate{{ConditionType: v1alpha1.PodConditionGuestRunning}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
		if gate != "" {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: v1alpha1.PodConditionGuestRunning, Status: gate, LastTransitionTime: metav1.NewTime(now.Add(-gateFor))})
		}
		if ready != "" {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: ready})
		}
		return p
	}
	source := func() *corev1.Pod { return pod("source", "a", corev1.ConditionTrue, time.Hour, corev1.ConditionTrue) }
	with := func(p *corev1.Pod, change func(*corev1.Pod)) *corev1.Pod { change(p); return p }
	for _, tc := range []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		pods []*corev1.Pod
		hold bool
		wait time.Duration
	}{
		{"the target Ready", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, 0, corev1.ConditionTrue), source()}, false, 0},
		{"the target's gate just went True, its kubelet has not followed yet", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, 0, corev1.ConditionFalse), source()}, true, KubeletFollowsGateWithin + time.Second},
		{"the target's kubelet has not followed for a second", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, time.Second, corev1.ConditionFalse), source()}, true, KubeletFollowsGateWithin},
		{"the target with no Ready condition yet", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, time.Second, ""), source()}, true, KubeletFollowsGateWithin},
		{"the bound may not have passed: the gate's time is in whole seconds", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, KubeletFollowsGateWithin, corev1.ConditionFalse), source()}, true, time.Second},
		{"a gate time with a fraction of a second (not from the API): counted from its whole second", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, 2500*time.Millisecond, corev1.ConditionFalse), source()}, true, time.Second},
		{"the target's kubelet has not followed within the bound", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, KubeletFollowsGateWithin+time.Second, corev1.ConditionFalse), source()}, false, 0},
		{"the target's gate not written yet", onB,
			[]*corev1.Pod{pod("target", "b", "", 0, corev1.ConditionFalse), source()}, true, KubeletFollowsGateWithin},
		{"the target's gate still False", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionFalse, time.Minute, corev1.ConditionFalse), source()}, true, KubeletFollowsGateWithin},
		{"two pods the guest runs in: the longer wait", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, 2*time.Second, corev1.ConditionFalse), pod("other", "b", corev1.ConditionTrue, time.Second, corev1.ConditionFalse), source()},
			true, KubeletFollowsGateWithin},
		{"one of two Ready, the other not", onB,
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, 0, corev1.ConditionTrue), pod("other", "b", corev1.ConditionTrue, 2*time.Second, corev1.ConditionFalse), source()},
			true, KubeletFollowsGateWithin - time.Second},
		{"no pod the guest runs in", onB, []*corev1.Pod{source()}, false, 0},
		{"the target ended: the guest is in no pod", onB,
			[]*corev1.Pod{with(pod("target", "b", corev1.ConditionTrue, 0, corev1.ConditionFalse), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), source()}, false, 0},
		{"no readiness gates: not on the pod network", onB,
			[]*corev1.Pod{
				with(pod("target", "b", "", 0, corev1.ConditionFalse), func(p *corev1.Pod) { p.Spec.ReadinessGates = nil }),
				with(source(), func(p *corev1.Pod) { p.Spec.ReadinessGates = nil }),
			}, false, 0},
		{"the VMI not running: no pod to wait for", &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIFailed, NodeName: "b"}},
			[]*corev1.Pod{pod("target", "b", corev1.ConditionTrue, 0, corev1.ConditionFalse), source()}, false, 0},
		{"no pods", onB, nil, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold, wait := HoldSourceGate(tc.vmi, tc.pods, now)
			if hold != tc.hold || wait != tc.wait {
				t.Errorf("HoldSourceGate = %t %s, want %t %s", hold, wait, tc.hold, tc.wait)
			}
		})
	}
}
