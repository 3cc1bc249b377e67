package migration

import (
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// What a migration with a deadline is given for its target, and what the next one avoids.
const (
	// ReasonTargetNotReadyInTime is the Warning Event, on the migration and on its VMI, of a
	// target given up on at its TargetReadyBy.
	ReasonTargetNotReadyInTime = "TargetNotReadyInTime"
	// ReasonTargetAvoidsNodes is the Normal Event of a migration whose target pod keeps off the
	// nodes AvoidNodes names.
	ReasonTargetAvoidsNodes = "TargetAvoidsNodes"
	// assumedBandwidth is the pace of a memory copy when no cap is configured: a LAN's.
	assumedBandwidth = 100 << 20 // bytes per second
	// switchOverAllowance is what a migration takes besides the copy: the target's QEMU taking
	// the guest, the switch-over, the source launcher's end.
	switchOverAllowance = 5 * time.Second
	// minTargetStart is the least a target launcher is given to start: scheduling, the pod's
	// start, QEMU's capabilities probe on a node's first launcher. A deadline too close to leave
	// this to two targets in turn gets no early bound: a second target would not make it either.
	minTargetStart = 10 * time.Second
	// AvoidFor is how long a node where a VM's target did not become ready is kept out of that
	// VM's next targets: long enough for a frozen or broken node to be found NotReady (the node
	// lifecycle controller's 40 s) and tainted, short enough that a node that recovered is not
	// refused for the VM's next evacuation.
	AvoidFor = 5 * time.Minute
)

// TargetReadyBy is when the target of a migration with a deadline must be ready (TargetReady)
// for a second target to still have time if this one never comes up: the time from the
// migration's creation to its deadline, less what moving the guest needs once a target is ready
// (a copy of its memory at the configured cap, else at a LAN's pace, and the switch-over), is
// shared equally between the first target and a second one. A node frozen while still Ready in
// the API (every process stopped, the node lifecycle controller not yet counting it out) takes
// a target pod and never starts it: without this bound the migration would wait for it until
// the deadline and lose the guest. ok is false when the migration has no deadline, or the
// deadline leaves no time for two targets in turn.
func TargetReadyBy(m *v1alpha1.VirtualMachineInstanceMigration, memory resource.Quantity, bandwidth int64) (by time.Time, ok bool) {
	if m.Status.Deadline == nil {
		return time.Time{}, false
	}
	if bandwidth <= 0 {
		bandwidth = assumedBandwidth
	}
	move := time.Duration(float64(memory.Value())/float64(bandwidth)*float64(time.Second)) + switchOverAllowance
	share := (m.Status.Deadline.Sub(m.CreationTimestamp.Time) - move) / 2
	if share < minTargetStart {
		return time.Time{}, false
	}
	return m.CreationTimestamp.Add(share), true
}

// preparing reports whether a migration in phase p has no ready target yet: it waits for its
// target pod to run, or for the target agent to listen.
func preparing(p v1alpha1.VirtualMachineInstanceMigrationPhase) bool {
	return waitingForTarget(p) || p == v1alpha1.MigrationPreparingTarget
}

// TargetLate says why a migration whose target is not ready by its TargetReadyBy must give that
// target up now, or "" and how long until it would (0: never, or its target is ready). memory
// is the VMI's, bandwidth the configured cap (0: none).
func TargetLate(m *v1alpha1.VirtualMachineInstanceMigration, target *corev1.Pod, memory resource.Quantity, bandwidth int64, now time.Time) (string, time.Duration) {
	if !preparing(m.Status.Phase) {
		return "", 0
	}
	by, ok := TargetReadyBy(m, memory, bandwidth)
	if !ok {
		return "", 0
	}
	if now.Before(by) {
		return "", by.Sub(now)
	}
	what := "no target pod yet"
	switch {
	case target == nil:
	case m.Status.Phase == v1alpha1.MigrationPreparingTarget:
		what = fmt.Sprintf("target pod %s runs on node %s, but its agent has not made it ready", target.Name, target.Spec.NodeName)
	default:
		what = "target pod " + target.Name + " " + holdUp(target)
	}
	return fmt.Sprintf("the target was not ready %s after the migration began, half the time the deadline %s leaves besides moving the guest; %s",
		by.Sub(m.CreationTimestamp.Time).Round(time.Second), m.Status.Deadline.UTC().Format(time.RFC3339), what), 0
}

// AvoidNodes are the nodes a new target of VMI vmiName (in namespace ns) keeps off: those where
// a migration of that VMI that failed within AvoidFor had placed a target that never became
// ready. The node may be frozen or broken while the API still shows it Ready, and the scheduler,
// left alone, would pick it again. migrations may hold any; the result is sorted.
func AvoidNodes(migrations []*v1alpha1.VirtualMachineInstanceMigration, ns, vmiName string, now time.Time) []string {
	var nodes []string
	for _, m := range migrations {
		s := m.Status
		if m.Namespace != ns || m.Spec.VMIName != vmiName || s.Phase != v1alpha1.MigrationFailed || s.TargetNode == "" ||
			s.EndTimestamp == nil || now.Sub(s.EndTimestamp.Time) >= AvoidFor || becameReady(m) || slices.Contains(nodes, s.TargetNode) {
			continue
		}
		nodes = append(nodes, s.TargetNode)
	}
	slices.Sort(nodes)
	return nodes
}

// becameReady reports whether m's target was ever ready (TargetReady, or a phase after it).
func becameReady(m *v1alpha1.VirtualMachineInstanceMigration) bool {
	for _, t := range m.Status.PhaseTransitionTimestamps {
		switch t.Phase {
		case v1alpha1.MigrationTargetReady, v1alpha1.MigrationRunning, v1alpha1.MigrationSucceeded:
			return true
		}
	}
	return false
}

// StaleNodes are the nodes whose kubelets have stopped renewing their Leases (in
// kube-node-lease) while the others go on: renewed more than half a lease's duration (twice
// the kubelet's renew interval, a quarter of the duration) before the latest renewal of any.
// Such a node is still Ready in the API until the node lifecycle controller's grace period
// ends, and a target pod bound to it would not start. The Node's Ready heartbeat cannot tell:
// a kubelet posts its status only every few minutes while nothing changes. Measured against
// the latest renewal rather than the clock, a control plane that stalled for everyone (an API
// server restart) makes no node stale, nor does a skewed clock. The result is sorted.
func StaleNodes(leases []*coordinationv1.Lease) []string {
	var latest time.Time
	for _, l := range leases {
		if r := l.Spec.RenewTime; r != nil && r.After(latest) {
			latest = r.Time
		}
	}
	var stale []string
	for _, l := range leases {
		r, d := l.Spec.RenewTime, l.Spec.LeaseDurationSeconds
		if r == nil || d == nil || *d <= 0 {
			continue
		}
		if latest.Sub(r.Time) > time.Duration(*d)*time.Second/2 {
			stale = append(stale, l.Name)
		}
	}
	slices.Sort(stale)
	return stale
}

// KeepOff is what a new target pod keeps off: the nodes AvoidNodes names, and the stale nodes
// (StaleNodes) too as long as a node the pod fits (fit, the placement's answer without them) is
// left. Stale nodes are only a preference: a late renewal is no reason to leave a VM with no
// target at all.
func KeepOff(avoid, stale, fit []string) []string {
	keepOff := slices.Clone(avoid)
	var staleFit []string
	for _, n := range fit {
		if slices.Contains(stale, n) {
			staleFit = append(staleFit, n)
		}
	}
	if len(staleFit) < len(fit) {
		keepOff = append(keepOff, staleFit...)
	}
	slices.Sort(keepOff)
	return slices.Compact(keepOff)
}
