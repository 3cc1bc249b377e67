package migration

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Default pending timeouts, KubeVirt's: a LifeboatConfig without them (or none at all) gets these.
const (
	DefaultUnschedulablePendingTimeout = 300 * time.Second
	DefaultCatchAllPendingTimeout      = 900 * time.Second
)

// Limits are how long a migration may wait for its target pod before it is given up on, and
// what TargetReadyBy needs of the configuration.
type Limits struct {
	// Unschedulable: while the scheduler finds no node for the target pod.
	Unschedulable time.Duration
	// CatchAll: until the target pod runs, whatever holds it back.
	CatchAll time.Duration
	// Bandwidth is the configured cap of a migration's transfer in bytes per second, 0 for
	// none: what TargetReadyBy counts a memory copy at.
	Bandwidth int64
}

// LimitsFrom reads the limits from the cluster's configuration; config may be nil.
func LimitsFrom(config *v1alpha1.LifeboatConfig) Limits {
	l := Limits{Unschedulable: DefaultUnschedulablePendingTimeout, CatchAll: DefaultCatchAllPendingTimeout}
	if config == nil {
		return l
	}
	if s := config.Spec.Migrations.UnschedulablePendingTimeoutSeconds; s != nil {
		l.Unschedulable = time.Duration(*s) * time.Second
	}
	if s := config.Spec.Migrations.CatchAllPendingTimeoutSeconds; s != nil {
		l.CatchAll = time.Duration(*s) * time.Second
	}
	if b := config.Spec.Migrations.BandwidthPerMigration; b != nil {
		l.Bandwidth = b.Value()
	}
	return l
}

// waitingForTarget reports whether a migration in this phase still waits for its target pod to run.
func waitingForTarget(p v1alpha1.VirtualMachineInstanceMigrationPhase) bool {
	return p == "" || p == v1alpha1.MigrationPending || p == v1alpha1.MigrationScheduling || p == v1alpha1.MigrationScheduled
}

// Stalled says why a migration that still waits for its target pod must be given up on now, or
// "" and how long until it would be (0: never, or no longer waiting). The wait counts from the
// migration's creation; its deadline, once passed, ends the wait at once, since a guest cannot
// leave in time through a target that does not even run.
func Stalled(m *v1alpha1.VirtualMachineInstanceMigration, target *corev1.Pod, limits Limits, now time.Time) (string, time.Duration) {
	if !waitingForTarget(m.Status.Phase) {
		return "", 0
	}
	what := "no target pod yet"
	if target != nil {
		what = "target pod " + target.Name + " " + holdUp(target)
	}
	if d := m.Status.Deadline; d != nil && !now.Before(d.Time) {
		return fmt.Sprintf("the deadline %s passed while waiting for the target: %s", d.UTC().Format(time.RFC3339), what), 0
	}
	waited := now.Sub(m.CreationTimestamp.Time)
	limit := limits.CatchAll
	if target != nil && unschedulable(target) {
		limit = min(limit, limits.Unschedulable)
	}
	if waited >= limit {
		return fmt.Sprintf("waited %s for the target (the limit is %s): %s", waited.Round(time.Second), limit, what), 0
	}
	next := limit - waited
	if d := m.Status.Deadline; d != nil {
		next = min(next, d.Sub(now))
	}
	return "", next
}

// unschedulable reports whether the scheduler has found no node for pod.
func unschedulable(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// holdUp says what the pod itself says keeps it from running: the scheduler's message, a
// container's waiting reason, or its phase.
func holdUp(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("is not scheduled (%s: %s)", c.Reason, c.Message)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf("does not run: container %s is waiting (%s: %s)", cs.Name, w.Reason, w.Message)
		}
	}
	if pod.Spec.NodeName == "" {
		return "is not scheduled"
	}
	return fmt.Sprintf("is %s on node %s", pod.Status.Phase, pod.Spec.NodeName)
}
