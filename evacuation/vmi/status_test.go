package vmi

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func vmiIn(phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"}}
	v.Status.Phase = phase
	return v
}

type podOpt func(*corev1.Pod)

func pod(opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-vm-abcde", Namespace: "ns"}}
	p.Status.Phase = corev1.PodPending
	for _, o := range opts {
		o(p)
	}
	return p
}

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }
func inPhase(ph corev1.PodPhase) podOpt {
	return func(p *corev1.Pod) { p.Status.Phase = ph }
}
func unschedulable(msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg})
	}
}
func exited(code int32, reason string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: launcher.ContainerName,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}}
	}
}
func evicted(msg string) podOpt {
	return func(p *corev1.Pod) { p.Status.Reason, p.Status.Message = "Evicted", msg }
}

func TestNextStatus(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC))
	cases := []struct {
		name        string
		vmi         *v1alpha1.VirtualMachineInstance
		pod         *corev1.Pod
		wantPhase   v1alpha1.VirtualMachineInstancePhase
		wantNode    string
		wantReason  string
		wantEvent   string
		wantMessage string // a part of the event message
	}{
		{name: "new VMI without a pod is Pending", vmi: vmiIn(""), wantPhase: v1alpha1.VMIPending},
		{name: "pod waiting for the scheduler", vmi: vmiIn(v1alpha1.VMIPending), pod: pod(), wantPhase: v1alpha1.VMIScheduling},
		{name: "unschedulable pod stays Scheduling with an event saying why", vmi: vmiIn(v1alpha1.VMIScheduling),
			pod:       pod(unschedulable("0/2 nodes are available: 2 Insufficient memory.")),
			wantPhase: v1alpha1.VMIScheduling, wantEvent: ReasonFailedScheduling, wantMessage: "2 Insufficient memory"},
		{name: "scheduled pod makes the VMI Scheduled on its node", vmi: vmiIn(v1alpha1.VMIScheduling), pod: pod(onNode("node-1")),
			wantPhase: v1alpha1.VMIScheduled, wantNode: "node-1", wantEvent: ReasonScheduled, wantMessage: "node-1"},
		{name: "a running guest is the agent's: no step back", vmi: vmiIn(v1alpha1.VMIRunning), pod: pod(onNode("node-1"), inPhase(corev1.PodRunning)),
			wantPhase: v1alpha1.VMIRunning},
		{name: "launcher exited 0: Succeeded", vmi: vmiIn(v1alpha1.VMIRunning), pod: pod(onNode("node-1"), inPhase(corev1.PodSucceeded), exited(0, "Completed")),
			wantPhase: v1alpha1.VMISucceeded, wantReason: ReasonGuestShutDown, wantEvent: ReasonStopped},
		{name: "launcher killed: Failed with the exit code", vmi: vmiIn(v1alpha1.VMIRunning), pod: pod(onNode("node-1"), inPhase(corev1.PodFailed), exited(137, "Error")),
			wantPhase: v1alpha1.VMIFailed, wantReason: ReasonLauncherFailed, wantEvent: ReasonLauncherFailed, wantMessage: "exited with code 137"},
		{name: "evicted pod: Failed with the kubelet's message", vmi: vmiIn(v1alpha1.VMIRunning),
			pod:       pod(onNode("node-1"), inPhase(corev1.PodFailed), evicted("The node was low on resource: memory."), exited(137, "Error")),
			wantPhase: v1alpha1.VMIFailed, wantReason: ReasonLauncherFailed, wantEvent: ReasonLauncherFailed, wantMessage: "launcher pod Evicted: The node was low on resource: memory."},
		{name: "pod deleted under a running guest: Failed", vmi: vmiIn(v1alpha1.VMIRunning),
			wantPhase: v1alpha1.VMIFailed, wantReason: ReasonLauncherVanished, wantEvent: ReasonLauncherVanished},
		{name: "source launcher ended while its migration is open: wait for the outcome",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := vmiIn(v1alpha1.VMIRunning)
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2"}
				return v
			}(), pod: pod(onNode("node-1"), inPhase(corev1.PodSucceeded), exited(0, "Completed")), wantPhase: v1alpha1.VMIRunning},
		{name: "source pod deleted through the API and gone while its migration is open: wait for the outcome",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := vmiIn(v1alpha1.VMIRunning)
				v.Status.NodeName = "node-1"
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2"}
				return v
			}(), wantPhase: v1alpha1.VMIRunning},
		{name: "pod gone after its migration failed: Failed",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := vmiIn(v1alpha1.VMIRunning)
				v.Status.NodeName = "node-1"
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2", Failed: true}
				return v
			}(), wantPhase: v1alpha1.VMIFailed, wantReason: ReasonLauncherVanished, wantEvent: ReasonLauncherVanished},
		{name: "terminal VMIs do not change", vmi: vmiIn(v1alpha1.VMISucceeded), pod: pod(inPhase(corev1.PodFailed)), wantPhase: v1alpha1.VMISucceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, events := NextStatus(tc.vmi, tc.pod, readyNodes, now)
			if status.Phase != tc.wantPhase {
				t.Errorf("phase = %q, want %q", status.Phase, tc.wantPhase)
			}
			if tc.wantNode != "" && status.NodeName != tc.wantNode {
				t.Errorf("nodeName = %q, want %q", status.NodeName, tc.wantNode)
			}
			if status.Reason != tc.wantReason {
				t.Errorf("reason = %q, want %q", status.Reason, tc.wantReason)
			}
			if status.Phase.Terminal() && status.Phase != tc.vmi.Status.Phase {
				if c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionReady); c == nil || c.Status != metav1.ConditionFalse {
					t.Errorf("a VMI that just ended must be Ready=False, conditions %+v", status.Conditions)
				}
			}
			if tc.wantEvent == "" {
				if len(events) != 0 {
					t.Errorf("want no events, got %+v", events)
				}
				return
			}
			if len(events) != 1 || events[0].Reason != tc.wantEvent || !strings.Contains(events[0].Message, tc.wantMessage) {
				t.Errorf("events = %+v, want one %s containing %q", events, tc.wantEvent, tc.wantMessage)
			}
		})
	}
}

func TestNextStatusRecordsTheLauncherPod(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 27, 22, 0, 0, 0, time.UTC))
	recorded := func(name string, uid types.UID) func(*v1alpha1.VirtualMachineInstance) {
		return func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.LauncherPod = &v1alpha1.LauncherPodRef{Name: name, UID: uid}
		}
	}
	withUID := func(uid types.UID) podOpt { return func(p *corev1.Pod) { p.UID = uid } }
	cases := []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		change func(*v1alpha1.VirtualMachineInstance)
		pod    *corev1.Pod
		want   *v1alpha1.LauncherPodRef
	}{
		{name: "no pod: nothing recorded", vmi: vmiIn("")},
		{name: "the pod just made is recorded by name and UID", vmi: vmiIn(v1alpha1.VMIPending), pod: pod(withUID("p1")),
			want: &v1alpha1.LauncherPodRef{Name: "launcher-vm-abcde", UID: "p1"}},
		{name: "a recorded pod stays recorded", vmi: vmiIn(v1alpha1.VMIScheduling), change: recorded("launcher-vm-abcde", "p1"),
			pod: pod(onNode("node-1"), withUID("p1")), want: &v1alpha1.LauncherPodRef{Name: "launcher-vm-abcde", UID: "p1"}},
		{name: "a pod made again under the recorded name does not replace the record", vmi: vmiIn(v1alpha1.VMIRunning),
			change: recorded("launcher-vm-abcde", "p1"), pod: pod(onNode("node-1"), inPhase(corev1.PodRunning), withUID("p2")),
			want: &v1alpha1.LauncherPodRef{Name: "launcher-vm-abcde", UID: "p1"}},
		{name: "a migration's target, recorded when it completed, stays", vmi: vmiIn(v1alpha1.VMIRunning),
			change: recorded("launcher-vm-target-x", "t1"), pod: pod(onNode("node-2"), inPhase(corev1.PodRunning), withUID("t1")),
			want: &v1alpha1.LauncherPodRef{Name: "launcher-vm-target-x", UID: "t1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.change != nil {
				tc.change(tc.vmi)
			}
			status, _ := NextStatus(tc.vmi, tc.pod, readyNodes, now)
			if !reflect.DeepEqual(status.LauncherPod, tc.want) {
				t.Errorf("launcherPod = %+v, want %+v", status.LauncherPod, tc.want)
			}
		})
	}
}
