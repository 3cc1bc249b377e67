package migration

import (
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestTargetLate(t *testing.T) {
	created := time.Date(2026, 11, 28, 9, 22, 35, 0, time.UTC)
	at := func(d time.Duration) time.Time { return created.Add(d) }
	mig := func(phase v1alpha1.VirtualMachineInstanceMigrationPhase, grace time.Duration) *v1alpha1.VirtualMachineInstanceMigration {
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		m.Status.Phase = phase
		if grace > 0 {
			m.Status.Deadline = &metav1.Time{Time: created.Add(grace)}
		}
		return m
	}
	// Seed 12's soak-2: scheduled to node-2, frozen two seconds before; the kubelet there never
	// starts it.
	onFrozen := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-soak-2-30047"}, Spec: corev1.PodSpec{NodeName: "node-2"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	runs := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-soak-2-30047"}, Spec: corev1.PodSpec{NodeName: "node-2"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	small, large := resource.MustParse("128Mi"), resource.MustParse("4Gi")
	const capped = 8 << 20 // 8 MiB/s, as the soak sets it

	for _, tc := range []struct {
		name      string
		m         *v1alpha1.VirtualMachineInstanceMigration
		target    *corev1.Pod
		memory    resource.Quantity
		bandwidth int64
		now       time.Time
		want      string // part of the reason; "" means not late
		wantAfter time.Duration
	}{
		// 60 s, less 1.28 s of copy at 100 MiB/s and 5 s of switch-over, halved: 26.86 s.
		{"a 60 s grace, a small VM: the target has until half the time left", mig(v1alpha1.MigrationScheduled, time.Minute), onFrozen, small, 0, at(10 * time.Second), "", 16860 * time.Millisecond},
		{"seed 12's frozen node: given up 27 s in, 33 s before the deadline", mig(v1alpha1.MigrationScheduled, time.Minute), onFrozen, small, 0, at(27 * time.Second),
			"target pod launcher-soak-2-30047 is Pending on node node-2", 0},
		{"the reason says the bound and the deadline", mig(v1alpha1.MigrationScheduled, time.Minute), onFrozen, small, 0, at(27 * time.Second),
			"not ready 27s after the migration began, half the time the deadline 2026-11-28T09:23:35Z leaves", 0},
		// 60 s less 16 s of copy at 8 MiB/s and 5 s: 19.5 s.
		{"a capped copy takes longer: the target has less time", mig(v1alpha1.MigrationScheduled, time.Minute), onFrozen, small, capped, at(20 * time.Second), "is Pending on node node-2", 0},
		{"a target that runs but whose agent does not answer", mig(v1alpha1.MigrationPreparingTarget, time.Minute), runs, small, 0, at(30 * time.Second), "its agent has not made it ready", 0},
		{"no target pod yet at the bound", mig(v1alpha1.MigrationPending, time.Minute), nil, small, 0, at(30 * time.Second), "no target pod yet", 0},
		{"a ready target is never late", mig(v1alpha1.MigrationTargetReady, time.Minute), runs, small, 0, at(50 * time.Second), "", 0},
		{"a running migration is never late here", mig(v1alpha1.MigrationRunning, time.Minute), runs, small, 0, at(50 * time.Second), "", 0},
		{"no deadline (a drain, a person's migration): only the pending limits", mig(v1alpha1.MigrationScheduled, 0), onFrozen, small, 0, at(time.Hour), "", 0},
		// 30 s less 5 s of switch-over and 41 s of copy: no time for even one target.
		{"a deadline too close for two targets: no early bound", mig(v1alpha1.MigrationScheduled, 30*time.Second), onFrozen, large, 0, at(29 * time.Second), "", 0},
		// 30 s less 6.28 s, halved: 11.86 s, above the 10 s floor.
		{"a 30 s grace still leaves room for two", mig(v1alpha1.MigrationScheduled, 30*time.Second), onFrozen, small, 0, at(12 * time.Second), "is Pending on node node-2", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, after := TargetLate(tc.m, tc.target, tc.memory, tc.bandwidth, tc.now)
			if (tc.want == "") != (reason == "") || !strings.Contains(reason, tc.want) {
				t.Errorf("reason %q, want one containing %q", reason, tc.want)
			}
			if after != tc.wantAfter {
				t.Errorf("recheck after %s, want %s", after, tc.wantAfter)
			}
		})
	}
}

func TestAvoidNodes(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 23, 5, 0, time.UTC)
	failed := func(vmi, node string, endedAgo time.Duration, reached ...v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi}}
		m.Status.Phase, m.Status.TargetNode, m.Status.EndTimestamp = v1alpha1.MigrationFailed, node, &metav1.Time{Time: now.Add(-endedAgo)}
		for _, p := range reached {
			m.Status.PhaseTransitionTimestamps = append(m.Status.PhaseTransitionTimestamps, v1alpha1.MigrationPhaseTransition{Phase: p})
		}
		return m
	}
	otherNamespace := failed("vm", "node-4", time.Second)
	otherNamespace.Namespace = "other"
	running := failed("vm", "node-5", time.Second)
	running.Status.Phase = v1alpha1.MigrationScheduled

	for _, tc := range []struct {
		name       string
		migrations []*v1alpha1.VirtualMachineInstanceMigration
		want       []string
	}{
		{"none failed", nil, nil},
		{"a target that never became ready, just now", []*v1alpha1.VirtualMachineInstanceMigration{failed("vm", "node-2", time.Second, v1alpha1.MigrationScheduled)}, []string{"node-2"}},
		{"a target that was ready: the migration failed for something else", []*v1alpha1.VirtualMachineInstanceMigration{
			failed("vm", "node-2", time.Second, v1alpha1.MigrationScheduled, v1alpha1.MigrationPreparingTarget, v1alpha1.MigrationTargetReady, v1alpha1.MigrationRunning)}, nil},
		{"long enough ago that the node had time to recover or be counted out", []*v1alpha1.VirtualMachineInstanceMigration{failed("vm", "node-2", AvoidFor)}, nil},
		{"a target that was never placed names no node", []*v1alpha1.VirtualMachineInstanceMigration{failed("vm", "", time.Second)}, nil},
		{"another VM's, another namespace's, an unfinished one", []*v1alpha1.VirtualMachineInstanceMigration{failed("other-vm", "node-3", time.Second), otherNamespace, running}, nil},
		{"each node once, sorted", []*v1alpha1.VirtualMachineInstanceMigration{
			failed("vm", "node-3", time.Minute), failed("vm", "node-2", 2*time.Minute), failed("vm", "node-3", time.Second)}, []string{"node-2", "node-3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AvoidNodes(tc.migrations, "ns", "vm", now); !slices.Equal(got, tc.want) {
				t.Errorf("avoid %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStaleNodes(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 22, 50, 0, time.UTC)
	lease := func(node string, renewedAgo time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}}}
	}
	noRenewal := lease("node-4", 0)
	noRenewal.Spec.RenewTime = nil
	for _, tc := range []struct {
		name   string
		leases []*coordinationv1.Lease
		want   []string
	}{
		{"all renewed within their interval", []*coordinationv1.Lease{lease("node-1", time.Second), lease("node-2", 9*time.Second), lease("node-3", 5*time.Second)}, nil},
		{"one frozen 25 s ago, past twice the renew interval", []*coordinationv1.Lease{lease("node-1", time.Second), lease("node-2", 25*time.Second), lease("node-3", 5*time.Second)}, []string{"node-2"}},
		{"a node frozen 2 s before is not told from a late renewal yet", []*coordinationv1.Lease{lease("node-1", time.Second), lease("node-2", 12*time.Second)}, nil},
		// An API server restart: nobody renewed for 30 s; none is singled out.
		{"everybody late together", []*coordinationv1.Lease{lease("node-1", 30*time.Second), lease("node-2", 35*time.Second), lease("node-3", 31*time.Second)}, nil},
		{"no renewal recorded tells nothing", []*coordinationv1.Lease{lease("node-1", time.Second), noRenewal}, nil},
		{"no leases", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StaleNodes(tc.leases); !slices.Equal(got, tc.want) {
				t.Errorf("stale %v, want %v", got, tc.want)
			}
		})
	}
}

func TestKeepOff(t *testing.T) {
	for _, tc := range []struct {
		name              string
		avoid, stale, fit []string
		want              []string
	}{
		{"nothing to keep off", nil, nil, []string{"node-2", "node-3"}, nil},
		{"a failed target's node", []string{"node-2"}, nil, []string{"node-3"}, []string{"node-2"}},
		{"a stale node, another fits", nil, []string{"node-2"}, []string{"node-2", "node-3"}, []string{"node-2"}},
		{"every fitting node stale: the scheduler chooses among them", nil, []string{"node-2", "node-3"}, []string{"node-2", "node-3"}, nil},
		{"both kinds, each once", []string{"node-2"}, []string{"node-2", "node-3"}, []string{"node-3", "node-4"}, []string{"node-2", "node-3"}},
		{"a failed target's node stays kept off even when nothing else fits", []string{"node-2"}, []string{"node-3"}, []string{"node-3"}, []string{"node-2"}},
		{"a stale node the pod does not fit anyway", nil, []string{"node-5"}, []string{"node-3"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := KeepOff(tc.avoid, tc.stale, tc.fit); !slices.Equal(got, tc.want) {
				t.Errorf("keep off %v, want %v", got, tc.want)
			}
		})
	}
}
