package migration

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestNext(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC))
	running := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"}}
	running.Status.Phase, running.Status.NodeName = v1alpha1.VMIRunning, "a"
	stopped := running.DeepCopy()
	stopped.Status.Phase = v1alpha1.VMISucceeded
	unmovable := running.DeepCopy()
	unmovable.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse,
		Reason: "DisksNotLiveMigratable", Message: `persistentVolumeClaim "db" (volume "data") is not ReadWriteMany`}}
	pinned := running.DeepCopy()
	pinned.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse,
		Reason: v1alpha1.VMIReasonNoTargetNode, Message: "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=a"}}
	mig := func(phase v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{UID: "m1", CreationTimestamp: now}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
		m.Status.Phase, m.Status.SourceNode = phase, "a"
		return m
	}
	pod := func(node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	stale := func(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
		m.CreationTimestamp = metav1.NewTime(now.Add(-DefaultUnschedulablePendingTimeout))
		return m
	}
	unschedulablePod := func() *corev1.Pod {
		p := pod("", corev1.PodPending)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "no nodes fit"}}
		return p
	}
	// The VMI whose guest the target agent saw run in migration uid's target launcher.
	arrivedFor := func(uid string, v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
		v = v.DeepCopy()
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, SourceNode: "a", TargetNode: "b", TargetNodeDomainReadyTimestamp: &now}
		return v
	}
	arrived := func(v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance { return arrivedFor("m1", v) }
	// The VMI failed by its controller when the source pod went before the outcome was recorded.
	vanished := running.DeepCopy()
	vanished.Status.Phase = v1alpha1.VMIFailed
	failed := []string{"MigrationFailed"}
	// A migration with a 60 s deadline, begun 30 s ago: past its target's share of the time
	// (TargetReadyBy: half of 60 s less the switch-over's 5 s for a VM of no memory, 27.5 s).
	late := func(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
		m.CreationTimestamp = metav1.NewTime(now.Add(-30 * time.Second))
		m.Status.Deadline = &metav1.Time{Time: now.Add(30 * time.Second)}
		return m
	}
	notInTime := []string{ReasonTargetNotReadyInTime}
	cases := []struct {
		name       string
		m          *v1alpha1.VirtualMachineInstanceMigration
		vmi        *v1alpha1.VirtualMachineInstance
		target     *corev1.Pod
		wantPhase  v1alpha1.VirtualMachineInstanceMigrationPhase
		wantAction Action
		wantReason string // part of the failure reason; none when empty
		wantEvents []string
	}{
		{"new: create the target pod", mig(""), running, nil, v1alpha1.MigrationPending, CreateTargetPod, "", nil},
		{"a VM its agent found not live-migratable: Failed before any target pod, with the reason", mig(""), unmovable, nil, v1alpha1.MigrationFailed, NoAction,
			`cannot be live-migrated (DisksNotLiveMigratable): persistentVolumeClaim "db"`, failed},
		{"target pod exists: Scheduling", mig(v1alpha1.MigrationPending), running, pod("", corev1.PodPending), v1alpha1.MigrationScheduling, NoAction, "", []string{"TargetPodCreated"}},
		{"target pod on a node: Scheduled", mig(v1alpha1.MigrationScheduling), running, pod("b", corev1.PodPending), v1alpha1.MigrationScheduled, NoAction, "", []string{"TargetScheduled"}},
		{"target launcher runs: the target agent prepares", mig(v1alpha1.MigrationScheduled), running, pod("b", corev1.PodRunning), v1alpha1.MigrationPreparingTarget, NoAction, "", []string{"PreparingTarget"}},
		{"the agents' phases are theirs", mig(v1alpha1.MigrationRunning), running, pod("b", corev1.PodRunning), v1alpha1.MigrationRunning, NoAction, "", nil},
		{"VMI no longer running: Failed", mig(v1alpha1.MigrationScheduling), stopped, pod("", corev1.PodPending), v1alpha1.MigrationFailed, DeleteTargetPod, "not Running", failed},
		{"VMI gone: Failed", mig(v1alpha1.MigrationPending), nil, nil, v1alpha1.MigrationFailed, NoAction, "does not exist", failed},
		{"the guest runs in the target while the source pod is gone: nothing is failed or deleted", mig(v1alpha1.MigrationRunning), arrived(vanished), pod("b", corev1.PodRunning), v1alpha1.MigrationRunning, NoAction, "", nil},
		{"a failed migration whose guest runs in the target keeps its target pod", mig(v1alpha1.MigrationFailed), arrived(running), pod("b", corev1.PodRunning), v1alpha1.MigrationFailed, NoAction, "", nil},
		{"another migration's guest in its target does not hold this one", mig(v1alpha1.MigrationFailed), arrivedFor("other", running), pod("b", corev1.PodRunning), v1alpha1.MigrationFailed, DeleteTargetPod, "", nil},
		{"target pod failed: Failed, pod removed", mig(v1alpha1.MigrationPreparingTarget), running, pod("b", corev1.PodFailed), v1alpha1.MigrationFailed, DeleteTargetPod, "target pod target failed", failed},
		{"target pod deleted mid-way: Failed", mig(v1alpha1.MigrationTargetReady), running, nil, v1alpha1.MigrationFailed, NoAction, "deleted", failed},
		{"failed by an agent: the target pod goes", mig(v1alpha1.MigrationFailed), running, pod("b", corev1.PodRunning), v1alpha1.MigrationFailed, DeleteTargetPod, "", nil},
		{"a target the scheduler cannot place, past its limit: Failed with the scheduler's words", stale(mig(v1alpha1.MigrationScheduling)), running, unschedulablePod(), v1alpha1.MigrationFailed, DeleteTargetPod, "no nodes fit", failed},
		{"a pending migration of a VM no other node can take: Failed at once, naming why", mig(v1alpha1.MigrationPending), pinned, nil, v1alpha1.MigrationFailed, NoAction,
			"(NoTargetNode): no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=a", failed},
		{"a target waiting for a node while no other node can take the VM: Failed at once, not after the pending timeout", mig(v1alpha1.MigrationScheduling), pinned, unschedulablePod(), v1alpha1.MigrationFailed, DeleteTargetPod,
			"target pod target cannot be scheduled: no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=a", failed},
		{"a target already placed is not failed for NoTargetNode", mig(v1alpha1.MigrationScheduling), pinned, pod("b", corev1.PodPending), v1alpha1.MigrationScheduled, NoAction, "", []string{"TargetScheduled"}},
		{"a target on a node that never starts it, past its share of the deadline: Failed, the pod goes", late(mig(v1alpha1.MigrationScheduled)), running, pod("b", corev1.PodPending),
			v1alpha1.MigrationFailed, DeleteTargetPod, "target pod target is Pending on node b", notInTime},
		{"a target whose agent never makes it ready: the same", late(mig(v1alpha1.MigrationPreparingTarget)), running, pod("b", corev1.PodRunning),
			v1alpha1.MigrationFailed, DeleteTargetPod, "its agent has not made it ready", notInTime},
		{"a ready target is not late", late(mig(v1alpha1.MigrationTargetReady)), running, pod("b", corev1.PodRunning), v1alpha1.MigrationTargetReady, NoAction, "", nil},
		{"succeeded: nothing", mig(v1alpha1.MigrationSucceeded), running, pod("b", corev1.PodRunning), v1alpha1.MigrationSucceeded, NoAction, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, action, events := Next(tc.m, tc.vmi, tc.target, LimitsFrom(nil), now)
			if status.Phase != tc.wantPhase || action != tc.wantAction {
				t.Errorf("phase %s action %d, want %s %d", status.Phase, action, tc.wantPhase, tc.wantAction)
			}
			// A migration that found no node is retried by the evacuation controller only when the
			// nodes change.
			if noTarget := tc.vmi == pinned && status.Phase == v1alpha1.MigrationFailed; status.TargetUnschedulable != (noTarget || tc.name == "a target the scheduler cannot place, past its limit: Failed with the scheduler's words") {
				t.Errorf("targetUnschedulable %v", status.TargetUnschedulable)
			}
			switch {
			case tc.wantReason == "" && status.FailureReason != "":
				t.Errorf("failure reason %q, want none", status.FailureReason)
			case !strings.Contains(status.FailureReason, tc.wantReason):
				t.Errorf("failure reason %q lacks %q", status.FailureReason, tc.wantReason)
			}
			var reasons []string
			for _, e := range events {
				reasons = append(reasons, e.Reason)
				if (e.Reason == "MigrationFailed" || e.Reason == ReasonTargetNotReadyInTime) && (e.Type != corev1.EventTypeWarning || e.Message != status.FailureReason) {
					t.Errorf("Event %+v: want a Warning whose message is the failure reason %q", e, status.FailureReason)
				}
			}
			if !slices.Equal(reasons, tc.wantEvents) {
				t.Errorf("Events %v, want %v", reasons, tc.wantEvents)
			}
		})
	}
}

func TestTheFirstStatusRecordsTheRequestedCause(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC))
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"}}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIRunning, "a"
	cases := []struct {
		name         string
		annotations  map[string]string
		wantCause    v1alpha1.MigrationCause
		wantDeadline string
	}{
		{"made by the evacuation controller", map[string]string{v1alpha1.AnnotationCause: "NodePressure", v1alpha1.AnnotationDeadline: "2026-11-22T04:01:00Z"}, v1alpha1.MigrationCauseNodePressure, "2026-11-22T04:01:00Z"},
		{"made by a person", nil, v1alpha1.MigrationCauseManual, ""},
		{"an unknown cause is not recorded as one", map[string]string{v1alpha1.AnnotationCause: "Boredom"}, v1alpha1.MigrationCauseManual, ""},
	}
	for _, tc := range cases {
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations, CreationTimestamp: now}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
		status, _, _ := Next(m, vmi, nil, LimitsFrom(nil), now)
		deadline := ""
		if status.Deadline != nil {
			deadline = status.Deadline.UTC().Format(time.RFC3339)
		}
		if status.Cause != tc.wantCause || deadline != tc.wantDeadline || status.SourceNode != "a" {
			t.Errorf("%s: cause %q deadline %q source %q; want %q %q a", tc.name, status.Cause, deadline, status.SourceNode, tc.wantCause, tc.wantDeadline)
		}
	}
}

// A migration that fails because no node takes its target pod says so, so that the evacuation
// controller waits for capacity before trying again; other failures do not.
func TestUnschedulableFailuresAreMarked(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC))
	running := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"}}
	running.Status.Phase, running.Status.NodeName = v1alpha1.VMIRunning, "a"
	stale := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-DefaultCatchAllPendingTimeout))},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}, Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationScheduling}}
	unschedulable := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "no nodes fit"}}}}
	pulling := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "b"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for _, tc := range []struct {
		target *corev1.Pod
		want   bool
	}{{unschedulable, true}, {pulling, false}, {nil, false}} {
		status, _, _ := Next(stale, running, tc.target, LimitsFrom(nil), now)
		if status.Phase != v1alpha1.MigrationFailed || status.TargetUnschedulable != tc.want {
			t.Errorf("target %+v: phase %s targetUnschedulable %v, want Failed %v", tc.target, status.Phase, status.TargetUnschedulable, tc.want)
		}
	}
}

// The target pod is recorded by name and UID once it exists: the target node's agent binds the
// migration to that pod, not to any pod labelled for the VMI.
func TestTheTargetPodIsRecordedByNameAndUID(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 27, 22, 0, 0, 0, time.UTC))
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"}}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIRunning, "a"
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: now}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
	m.Status.Phase = v1alpha1.MigrationPending
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-vm-target", UID: "t1"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	status, _, _ := Next(m, vmi, target, LimitsFrom(nil), now)
	if status.Phase != v1alpha1.MigrationScheduling || status.TargetPod != "launcher-vm-target" || status.TargetPodUID != "t1" {
		t.Errorf("phase %s, target pod %q UID %q; want Scheduling, launcher-vm-target, t1", status.Phase, status.TargetPod, status.TargetPodUID)
	}
}
