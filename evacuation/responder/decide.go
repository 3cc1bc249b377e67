// Package responder answers lifecycle.k8s.io/v1alpha1 Evictions of launcher pods (seed 002, as
// it shipped in Kubernetes 1.37): when the evictionrequest controller makes lifeboat the active
// responder for a VM's pod, lifeboat live-migrates the VM off the pod's node and reports its
// progress on its own status.responders[] entry, or declines at once when the VM cannot move.
package responder

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmictl "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// Outcomes of an answered Eviction, as metric labels.
const (
	OutcomeMigrated = "migrated"
	OutcomeDeclined = "declined"
	OutcomeExternal = "external"
	OutcomeEnded    = "ended"
	OutcomeCanceled = "canceled"
	// OutcomeInterrupted: lifeboat's turn was ended by the evictionrequest controller.
	OutcomeInterrupted = "interrupted"
	// OutcomeStalled: no node would take the VM; lifeboat gave its turn up.
	OutcomeStalled = "stalled"
)

// Event reasons on the Eviction.
const (
	ReasonEvacuating       = "Evacuating"
	ReasonEvacuated        = "Evacuated"
	ReasonDeclined         = "Declined"
	ReasonLeftToExternal   = "LeftToExternalController"
	ReasonVMEnded          = "VMEnded"
	ReasonCanceled         = "EvacuationCanceled"
	ReasonInterrupted      = "EvacuationInterrupted"
	ReasonStalled          = "EvacuationStalled"
	ReasonNotCancelable    = "EvacuationNotCancelable"
	ReasonRejectedByServer = "StatusRejected"
)

// Bounds of the API on a responder's writes (k8s.io/kubernetes pkg/apis/lifecycle/validation).
const (
	// MinHeartbeatInterval: responders should not heartbeat more often (the API's guidance).
	MinHeartbeatInterval = 20 * time.Second
	// MaxHeartbeatInterval is lifeboat's own upper bound, far inside the API's 20-minute deadline.
	MaxHeartbeatInterval = 3 * time.Minute
	// maxMessage is the API's limit on a responder's message.
	maxMessage = 4000
)

// Observation is what the controller sees of one Eviction and the VM behind it.
type Observation struct {
	Eviction *lifecyclev1alpha1.Eviction
	// Pod is the target pod if it is a launcher pod whose UID matches the target's; else nil.
	Pod *corev1.Pod
	// VMI is the VMI that controls Pod; nil if it is gone.
	VMI *v1alpha1.VirtualMachineInstance
	// Migration is the VMI's newest evacuation migration off Pod's node; nil if none.
	Migration *v1alpha1.VirtualMachineInstanceMigration
	// Config is the LifeboatConfig named cluster; nil if there is none.
	Config *v1alpha1.LifeboatConfig
}

// Write is lifeboat's own status.responders[] entry to apply.
type Write struct {
	Heartbeat  metav1.Time
	Expected   *metav1.Time
	Completion *metav1.Time
	Message    string
}

// Event is a Kubernetes Event on the Eviction.
type Event struct{ Type, Reason, Message string }

// Plan is what the controller does for one Eviction.
type Plan struct {
	// Mark sets the VMI's evacuation mark (cause EvictionRequest) with this message; "" leaves it.
	Mark string
	// ClearMark clears a mark this Eviction set, which cancels its unfinished migration.
	ClearMark string
	// Write, if not nil, is applied to lifeboat's status.responders[] entry after the mark.
	Write *Write
	// Outcome, when the Eviction is answered for good by this plan, is the metric label.
	Outcome string
	Events  []Event
	// RequeueAfter, if positive, is when to look again (the next heartbeat).
	RequeueAfter time.Duration
}

// Settings are the responder's heartbeat bounds: at least every Max, never more often than Min.
type Settings struct{ Min, Max time.Duration }

// Validate refuses heartbeats faster than the API asks or slower than lifeboat promises.
func (s Settings) Validate() error {
	if s.Min < MinHeartbeatInterval || s.Max < s.Min || s.Max > MaxHeartbeatInterval {
		return fmt.Errorf("heartbeat interval %s..%s: want at least %s apart and at most %s", s.Min, s.Max, MinHeartbeatInterval, MaxHeartbeatInterval)
	}
	return nil
}

// Decide is the responder's decision for one Eviction, from what the cluster shows and now.
func Decide(o Observation, s Settings, now time.Time) Plan {
	ev := o.Eviction
	if ev.Status.ObservedGeneration == nil || o.Pod == nil {
		return Plan{} // not yet processed by the evictionrequest controller, or not a VM's pod
	}
	switch TargetState(ev) {
	case lifecyclev1alpha1.ResponderStateActive:
		return active(o, s, now)
	case lifecyclev1alpha1.ResponderStateCanceled:
		return stop(o, ReasonCanceled, OutcomeCanceled, "every requester withdrew")
	case lifecyclev1alpha1.ResponderStateInterrupted:
		// Our turn is over; the next responder (in the end the imperative evictor) takes the pod.
		return stop(o, ReasonInterrupted, OutcomeInterrupted, "lifeboat's turn on the Eviction was interrupted and the next responder takes the pod")
	}
	// Inactive: not our turn yet. Completed: nothing left to do.
	return Plan{}
}

func active(o Observation, s Settings, now time.Time) Plan {
	entry := Entry(o.Eviction)
	if entry == nil || entry.StartTime == nil || entry.CompletionTime != nil {
		// The API requires startTime before any write, and completionTime ends our part.
		return Plan{}
	}
	vmi, pod := o.VMI, o.Pod
	node := pod.Spec.NodeName
	if vmi == nil {
		return complete(o, now, OutcomeEnded, Event{corev1.EventTypeNormal, ReasonVMEnded,
			fmt.Sprintf("the VMI of pod %s is gone; nothing to evacuate", pod.Name)})
	}
	id := vmi.Namespace + "/" + vmi.Name
	strategy := v1alpha1.EffectiveEvictionStrategy(vmi, o.Config)
	movedAway := migratedFrom(vmi, node)
	switch {
	case vmi.Status.Phase.Terminal() || (vmictl.PodEnded(pod) && !movedAway):
		return complete(o, now, OutcomeEnded, Event{corev1.EventTypeNormal, ReasonVMEnded,
			fmt.Sprintf("VM %s is %s and its pod %s is %s; nothing to evacuate", id, vmi.Status.Phase, pod.Name, pod.Status.Phase)})
	case movedAway && vmictl.PodEnded(pod):
		return complete(o, now, OutcomeMigrated, Event{corev1.EventTypeNormal, ReasonEvacuated,
			fmt.Sprintf("VM %s was live-migrated from node %s to node %s and its pod %s has ended", id, node, vmi.Status.NodeName, pod.Name)})
	case vmi.Status.NodeName != node && !movedAway:
		return complete(o, now, OutcomeDeclined, Event{corev1.EventTypeNormal, ReasonDeclined,
			fmt.Sprintf("pod %s does not run VM %s (the VM is on node %q); the next responder evicts the pod", pod.Name, id, vmi.Status.NodeName)})
	case movedAway:
	case strategy == v1alpha1.EvictionStrategyExternal:
		p := complete(o, now, OutcomeExternal, Event{corev1.EventTypeNormal, ReasonLeftToExternal,
			fmt.Sprintf("VM %s has eviction strategy External: marked for evacuation from node %s and left to the external controller", id, node)})
		if !marked(vmi, node) {
			p.Mark = markMessage(o)
		}
		return p
	case strategy == v1alpha1.EvictionStrategyNone:
		return complete(o, now, OutcomeDeclined, Event{corev1.EventTypeNormal, ReasonDeclined,
			fmt.Sprintf("VM %s has eviction strategy None: lifeboat does not migrate it; the next responder evicts pod %s", id, pod.Name)})
	case !migratable(vmi):
		return complete(o, now, OutcomeDeclined, Event{corev1.EventTypeNormal, ReasonDeclined,
			fmt.Sprintf("VM %s (eviction strategy %s) cannot be live-migrated (%s); the next responder evicts pod %s", id, strategy, notMigratableReason(vmi), pod.Name)})
	}

	if m := o.Migration; !movedAway && stalledSince(m, entry.StartTime) {
		// Nothing is being done until the cluster changes (seed 002: no heartbeat without work):
		// give the turn up, so the Eviction goes on to the next responder. The mark stays, so the
		// VM still leaves when a node can take it.
		return complete(o, now, OutcomeStalled, Event{corev1.EventTypeWarning, ReasonStalled,
			fmt.Sprintf("no node takes VM %s: migration %s failed (%s); lifeboat gives up its turn, and the VM stays marked and leaves node %s when the nodes or their free capacity change",
				id, m.Name, m.Status.FailureReason, node)})
	}
	var p Plan
	if !movedAway && !marked(vmi, node) {
		p.Mark = markMessage(o)
		p.Events = append(p.Events, Event{corev1.EventTypeNormal, ReasonEvacuating,
			fmt.Sprintf("live-migrating VM %s off node %s for this eviction", id, node)})
	}
	msg := progressMessage(o)
	last := entry.HeartbeatTime
	switch {
	case last == nil:
	case now.Sub(last.Time) >= s.Max:
	case msg != deref(entry.Message) && now.Sub(last.Time) >= s.Min:
	case msg != deref(entry.Message):
		p.RequeueAfter = last.Add(s.Min).Sub(now)
		return p
	default:
		p.RequeueAfter = last.Add(s.Max).Sub(now)
		return p
	}
	hb := presentTime(entry, now)
	expected := metav1.NewTime(laterOf(expectedCompletion(o, now), hb.Add(s.Min)))
	p.Write = &Write{Heartbeat: hb, Expected: &expected, Message: msg}
	p.RequeueAfter = s.Max
	return p
}

// complete answers the Eviction for good: completionTime now, with the reason as the message.
// The heartbeat is bumped only if the last one is old enough, so heartbeats never come faster
// than the API asks even when an answer follows one closely.
func complete(o Observation, now time.Time, outcome string, e Event) Plan {
	entry := Entry(o.Eviction)
	at := presentTime(entry, now)
	hb := at
	if entry.HeartbeatTime != nil && at.Sub(entry.HeartbeatTime.Time) < MinHeartbeatInterval {
		hb = *entry.HeartbeatTime
	}
	return Plan{
		Write:   &Write{Heartbeat: hb, Completion: &at, Message: truncate(e.Message)},
		Outcome: outcome,
		Events:  []Event{e},
	}
}

// stop ends lifeboat's work on an Eviction it no longer answers (every requester withdrew, or its
// turn was interrupted): it clears the mark this Eviction set, which cancels the unfinished
// migration and takes the descheduler's eviction-in-progress off the source pod. A migration in
// post-copy or paused cannot go back and finishes; the Event says so. A mark another cause set
// since (the kubelet, the pod's deletion) is not this Eviction's to clear: after an interruption,
// which usually comes with such a cause, the Event says the evacuation goes on for it.
func stop(o Observation, reason, outcome, why string) Plan {
	vmi, node := o.VMI, o.Pod.Spec.NodeName
	if vmi == nil || !marked(vmi, node) {
		return Plan{}
	}
	id := vmi.Namespace + "/" + vmi.Name
	if !markedByEviction(vmi) {
		if outcome != OutcomeInterrupted {
			return Plan{}
		}
		return Plan{Outcome: outcome, Events: []Event{{corev1.EventTypeNormal, reason,
			fmt.Sprintf("%s; VM %s is now marked for another cause (%s), so its evacuation from node %s goes on", why, id, cmp.Or(vmi.EvacuationCause(), "not recorded"), node)}}}
	}
	if m := o.Migration; m != nil && !m.Status.Phase.Terminal() && (m.Status.Mode == v1alpha1.MigrationModePostCopy || m.Status.Mode == v1alpha1.MigrationModePaused) {
		return Plan{Events: []Event{{corev1.EventTypeWarning, ReasonNotCancelable,
			fmt.Sprintf("%s, but migration %s of VM %s is in %s and cannot be cancelled; it finishes on node %s", why, m.Name, id, m.Status.Mode, m.Status.TargetNode)}}}
	}
	msg := fmt.Sprintf("%s: the evacuation of VM %s from node %s is cancelled", why, id, node)
	if m := o.Migration; m != nil && !m.Status.Phase.Terminal() {
		msg += fmt.Sprintf(" (migration %s stops; the VM stays)", m.Name)
	}
	return Plan{ClearMark: msg, Outcome: outcome, Events: []Event{{corev1.EventTypeNormal, reason, msg}}}
}

// stalledSince: the migration, ended after the responder's turn began, failed because no node
// would take its target pod; the evacuation controller tries again only when capacity changes.
func stalledSince(m *v1alpha1.VirtualMachineInstanceMigration, start *metav1.Time) bool {
	return m != nil && m.Status.Phase == v1alpha1.MigrationFailed && m.Status.TargetUnschedulable &&
		m.Status.EndTimestamp != nil && !m.Status.EndTimestamp.Before(start)
}

// progressMessage says where the evacuation stands, for a person reading the Eviction.
func progressMessage(o Observation) string {
	vmi, node := o.VMI, o.Pod.Spec.NodeName
	id := vmi.Namespace + "/" + vmi.Name
	var msg string
	m := o.Migration
	switch {
	case migratedFrom(vmi, node):
		msg = fmt.Sprintf("VM %s now runs on node %s; waiting for its old pod %s to end", id, vmi.Status.NodeName, o.Pod.Name)
	case m == nil:
		msg = fmt.Sprintf("VM %s is marked for evacuation from node %s; waiting for its migration to be created", id, node)
	case m.Status.Phase == v1alpha1.MigrationFailed:
		msg = fmt.Sprintf("migration %s of VM %s failed (%s); lifeboat retries while the eviction stands", m.Name, id, m.Status.FailureReason)
	default:
		phase := m.Status.Phase
		if phase == "" {
			phase = v1alpha1.MigrationPending
		}
		msg = fmt.Sprintf("live-migrating VM %s off node %s: migration %s is %s", id, node, m.Name, phase)
		if m.Status.TargetNode != "" {
			msg += " to node " + m.Status.TargetNode
		}
		if m.Status.Mode != "" {
			msg += fmt.Sprintf(" (%s)", m.Status.Mode)
		}
		if m.WaitingForSlot() {
			msg += ", made ahead: it waits for a free parallel-migration slot to move memory"
		}
	}
	return truncate(msg + "; requested by " + requesters(o.Eviction))
}

// Rough costs of a migration for the estimate when the migration sets no deadline: creating and
// starting the target pod, and the memory copy at the configured cap or else a LAN's pace.
const (
	setupEstimate     = 30 * time.Second
	assumedBandwidth  = 100 << 20 // bytes per second
	sourceEndEstimate = 30 * time.Second
)

// expectedCompletion estimates when the evacuation ends: the migration's own deadline if it has
// one (its convergence escalates to meet it), else its start plus set-up and the memory copy.
func expectedCompletion(o Observation, now time.Time) time.Time {
	m := o.Migration
	if migratedFrom(o.VMI, o.Pod.Spec.NodeName) {
		return now.Add(sourceEndEstimate)
	}
	if p := progress(m); p != nil {
		// What remains, at the rate the transfer gains on the guest's writes, from when the
		// source agent read it; never past the deadline, which escalation keeps.
		end := p.UpdateTime.Add(time.Duration(float64(p.DataRemaining) / float64(p.MemoryBandwidth-p.MemoryDirtyRate) * float64(time.Second)))
		if m.Status.Deadline != nil && end.After(m.Status.Deadline.Time) {
			return m.Status.Deadline.Time
		}
		return end
	}
	if m != nil && m.Status.Deadline != nil {
		return m.Status.Deadline.Time
	}
	start := now
	if m != nil && !m.Status.Phase.Terminal() {
		start = m.CreationTimestamp.Time
	}
	bandwidth := int64(assumedBandwidth)
	if o.Config != nil {
		if b := o.Config.Spec.Migrations.BandwidthPerMigration; b != nil && b.Value() > 0 {
			bandwidth = b.Value()
		}
	}
	copyTime := time.Duration(float64(o.VMI.Spec.Memory.Value()) / float64(bandwidth) * float64(time.Second))
	return start.Add(setupEstimate + copyTime)
}

// progress is a running migration's transfer figures when they let one project its end: the
// transfer gains on the guest's writes.
func progress(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.MigrationProgress {
	if m == nil || m.Status.Phase != v1alpha1.MigrationRunning {
		return nil
	}
	if p := m.Status.Progress; p != nil && p.DataTotal > 0 && p.MemoryBandwidth > p.MemoryDirtyRate {
		return p
	}
	return nil
}

// presentTime is now, but never before the entry's startTime or last heartbeat: the API
// rejects a heartbeat or completion that goes back, and startTime may come from a clock ahead.
func presentTime(entry *lifecyclev1alpha1.ResponderStatus, now time.Time) metav1.Time {
	t := now
	if entry.StartTime != nil {
		t = laterOf(t, entry.StartTime.Time)
	}
	if entry.HeartbeatTime != nil {
		t = laterOf(t, entry.HeartbeatTime.Time)
	}
	return metav1.NewTime(t)
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// markMessage is the EvictionRequested condition's message; it names the Eviction, which is how
// a later cancellation knows the mark is its own.
func markMessage(o Observation) string {
	return fmt.Sprintf("Eviction %s asks pod %s to leave node %s (requested by %s)",
		o.Eviction.Name, o.Pod.Name, o.Pod.Spec.NodeName, requesters(o.Eviction))
}

// TargetState is lifeboat's state in the Eviction's targetResponders; "" if it is not listed.
func TargetState(ev *lifecyclev1alpha1.Eviction) lifecyclev1alpha1.ResponderStateType {
	for _, r := range ev.Status.TargetResponders {
		if r.Name == v1alpha1.EvictionResponderName {
			return r.State
		}
	}
	return ""
}

// Entry is lifeboat's status.responders[] entry; nil if there is none yet.
func Entry(ev *lifecyclev1alpha1.Eviction) *lifecyclev1alpha1.ResponderStatus {
	for i := range ev.Status.Responders {
		if ev.Status.Responders[i].Name == v1alpha1.EvictionResponderName {
			return &ev.Status.Responders[i]
		}
	}
	return nil
}

func requesters(ev *lifecyclev1alpha1.Eviction) string {
	var names []string
	for _, r := range ev.Status.Requesters {
		if r.Intent == lifecyclev1alpha1.RequesterIntentEviction {
			names = append(names, r.Name)
		}
	}
	if len(names) == 0 {
		return "no requester"
	}
	return strings.Join(names, ", ")
}

// migratedFrom: the VM left node by a completed migration.
func migratedFrom(vmi *v1alpha1.VirtualMachineInstance, node string) bool {
	s := vmi.Status.MigrationState
	return s != nil && s.Completed && s.SourceNode == node && vmi.Status.NodeName != node
}

func marked(vmi *v1alpha1.VirtualMachineInstance, node string) bool {
	return node != "" && vmi.Status.NodeName == node && vmi.Status.EvacuationNodeName == node
}

// markedByEviction: the mark's cause is an EvictionRequest. A pod has one Eviction at a time, so
// a mark with that cause on the pod's node is this Eviction's; any other cause (the kubelet, a
// drain, the eviction API) came later or from elsewhere and is not ours to clear.
func markedByEviction(vmi *v1alpha1.VirtualMachineInstance) bool {
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
	return c != nil && c.Status == metav1.ConditionTrue && c.Reason == string(v1alpha1.MigrationCauseEvictionRequest)
}

func migratable(vmi *v1alpha1.VirtualMachineInstance) bool {
	return meta.IsStatusConditionTrue(vmi.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
}

func notMigratableReason(vmi *v1alpha1.VirtualMachineInstance) string {
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	if c == nil {
		return "its migratability is not known yet"
	}
	return c.Reason
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func truncate(s string) string {
	if len(s) > maxMessage {
		return s[:maxMessage]
	}
	return s
}
