package migration

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestStalled(t *testing.T) {
	created := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	limits := Limits{Unschedulable: 5 * time.Minute, CatchAll: 15 * time.Minute}
	mig := func(phase v1alpha1.VirtualMachineInstanceMigrationPhase, deadline *time.Time) *v1alpha1.VirtualMachineInstanceMigration {
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		m.Status.Phase = phase
		if deadline != nil {
			m.Status.Deadline = &metav1.Time{Time: *deadline}
		}
		return m
	}
	unschedulable := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
	}}}}
	pulling := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Spec: corev1.PodSpec{NodeName: "b"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
		ContainerStatuses: []corev1.ContainerStatus{{Name: "compute", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}}}}}}
	running := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Spec: corev1.PodSpec{NodeName: "b"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	at := func(d time.Duration) time.Time { return created.Add(d) }

	for _, tc := range []struct {
		name      string
		m         *v1alpha1.VirtualMachineInstanceMigration
		target    *corev1.Pod
		now       time.Time
		want      string // part of the reason; "" means not stalled
		wantAfter time.Duration
	}{
		{"unschedulable, within its limit: recheck when it ends", mig(v1alpha1.MigrationScheduling, nil), unschedulable, at(time.Minute), "", 4 * time.Minute},
		{"unschedulable past its limit: the scheduler's words", mig(v1alpha1.MigrationScheduling, nil), unschedulable, at(5 * time.Minute), "didn't match Pod's node affinity/selector", 0},
		{"an image that cannot be pulled, within the catch-all", mig(v1alpha1.MigrationScheduled, nil), pulling, at(10 * time.Minute), "", 5 * time.Minute},
		{"an image that cannot be pulled, past the catch-all", mig(v1alpha1.MigrationScheduled, nil), pulling, at(15 * time.Minute), "container compute is waiting (ImagePullBackOff", 0},
		{"the deadline passed first", mig(v1alpha1.MigrationScheduling, ptr.To(at(45*time.Second))), unschedulable, at(46 * time.Second), "the deadline 2026-11-25T06:00:45Z passed", 0},
		{"the deadline comes before the limit: recheck then", mig(v1alpha1.MigrationScheduling, ptr.To(at(45*time.Second))), unschedulable, at(15 * time.Second), "", 30 * time.Second},
		{"no target pod yet, past the catch-all", mig(v1alpha1.MigrationPending, nil), nil, at(16 * time.Minute), "no target pod yet", 0},
		{"the target runs: the agents' phases have no such limit", mig(v1alpha1.MigrationPreparingTarget, nil), running, at(time.Hour), "", 0},
		{"running migrations never stall here", mig(v1alpha1.MigrationRunning, ptr.To(at(time.Second))), running, at(time.Hour), "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, after := Stalled(tc.m, tc.target, limits, tc.now)
			if (tc.want == "") != (reason == "") || !strings.Contains(reason, tc.want) {
				t.Errorf("reason %q, want one containing %q", reason, tc.want)
			}
			if after != tc.wantAfter {
				t.Errorf("recheck after %s, want %s", after, tc.wantAfter)
			}
		})
	}
}

func TestLimitsFromTheConfiguration(t *testing.T) {
	if got := LimitsFrom(nil); got != (Limits{Unschedulable: 5 * time.Minute, CatchAll: 15 * time.Minute}) {
		t.Errorf("without a LifeboatConfig: %+v, want KubeVirt's 5m and 15m", got)
	}
	cfg := &v1alpha1.LifeboatConfig{}
	cfg.Spec.Migrations.UnschedulablePendingTimeoutSeconds = ptr.To[int64](10)
	if got := LimitsFrom(cfg); got != (Limits{Unschedulable: 10 * time.Second, CatchAll: 15 * time.Minute}) {
		t.Errorf("with 10 s for unschedulable targets: %+v", got)
	}
}
