// Package evacuate is the evacuation controller: it turns evacuation marks into migrations.
// For each running VMI whose status.evacuationNodeName equals its nodeName, that is not already
// migrating and whose eviction strategy allows a migration, it creates a
// VirtualMachineInstanceMigration that records why (the cause) and, for node pressure, by when
// (the deadline), within the cluster's parallel-migration limits and most urgent first.
//
// The limits bound the migrations that move memory. Beyond them, as many again may be made
// ahead, waiting for a slot (status.evacuation.waitingForSlot): their target pods are scheduled
// and their launchers started while the running migrations move memory, so that a freed slot
// goes to a migration whose target is ready instead of one that starts a launcher first.
package evacuate

import (
	"cmp"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Candidate is a marked VMI and what its migration would record.
type Candidate struct {
	VMI      *v1alpha1.VirtualMachineInstance
	Cause    v1alpha1.MigrationCause
	Deadline *metav1.Time
	// markedAt is when the mark was set (the EvictionRequested condition's transition).
	markedAt time.Time
	// madeAhead: the VMI's migration exists, made ahead of a free slot.
	madeAhead bool
	// FailedOn are the target nodes of this evacuation's failed attempts, sorted: its next
	// target prefers another node (a target agent killed mid-migration may not be back yet).
	FailedOn []string
}

// Decision is what one look at the cluster concludes.
type Decision struct {
	// Create are the candidates to create migrations for now, most urgent first.
	Create []Candidate
	// Prepare are the candidates to create migrations for ahead of a free slot, most urgent
	// first: they prepare their targets and wait for a slot before moving memory.
	Prepare []Candidate
	// Release are migrations made ahead that now have a slot and may move memory.
	Release []*v1alpha1.VirtualMachineInstanceMigration
	// Follow are migrations made ahead, their targets ready, each to take the slot of a
	// migration under way from its node the moment that one's transfer ends
	// (status.evacuation.slotAfterUID): their source agent starts them then, without waiting
	// for this controller to see the end and release them.
	Follow []Follow
	// Withdraw are migrations made ahead whose VMI is no longer marked (or gone) before they got
	// a slot: they have moved nothing, and go with their target pods.
	Withdraw []*v1alpha1.VirtualMachineInstanceMigration
	// External are marked VMIs left to an external controller.
	External []*v1alpha1.VirtualMachineInstance
	// RetryAfter, if positive, is when a candidate held back by its backoff becomes due.
	RetryAfter time.Duration
	// AwaitingCapacity are marked VMIs whose last migration found no node for its target pod and
	// that wait for the nodes or their free capacity to change; each with that migration.
	AwaitingCapacity []Awaiting
}

// Follow is a migration made ahead and the migration under way whose slot it takes.
type Follow struct {
	Migration, After *v1alpha1.VirtualMachineInstanceMigration
}

// Awaiting is a marked VMI held back until capacity changes, and the migration that found none.
type Awaiting struct {
	VMI    *v1alpha1.VirtualMachineInstance
	Failed *v1alpha1.VirtualMachineInstanceMigration
}

// Backoff after a failed migration while the mark stays: base doubling up to max. Before a
// deadline the wait is at most beforeDeadline: the deadline bounds the attempts, and a VM still
// on its node at the deadline is lost, so a retry that waits only loses time; the second keeps
// a migration that fails at once from being made again in a loop.
const (
	backoffBase    = 5 * time.Second
	backoffMax     = 2 * time.Minute
	beforeDeadline = time.Second
)

// Plan decides which marked VMIs get a migration now. migrations are all existing migrations;
// config may be nil (defaults: 5 per cluster, 2 outbound per node). Only migrations this
// controller recorded as its own (status.evacuation) count against those limits and in a VMI's
// backoff: anyone who may create a migration could otherwise fill the limits with migrations
// that never end, or fail migrations in another VM's name (N3). A person's migration still keeps
// its VMI from getting a second one. capacityChanged is the last
// time a node came, changed what it accepts, or had a pod end: a VMI whose last migration found no
// node for its target is retried only after such a change (and its backoff), since nothing else
// could place the target now.
//
// Within the limits go, most urgent first, migrations made ahead (Release) and new ones
// (Create); beyond them, up to as many again per node and in the cluster are made ahead
// (Prepare). A more urgent new candidate (an earlier deadline, a more pressing cause) takes a
// freed slot before one made ahead; among equals, the one made ahead goes first, or it would
// hold its prepared target while later ones pass it. Migrations are made ahead from a node only
// once those with its slots have their targets ready: made together, the targets would compete
// for the target node's CPU with the ones that can move memory first. A migration whose guest
// already runs on its target (arrived) holds no slot.
//
// A migration made ahead whose target is ready and that gets no slot follows one under way from
// its node that no other follows (the one that started first): when that one's transfer ends,
// the slot is its own, whoever sees the end first (its source agent, or this plan). Only the
// most urgent follow: none on a node where a new candidate ahead of them in the order waits.
// Following is a promise: a more urgent candidate that comes later waits for the next slot.
func Plan(vmis []*v1alpha1.VirtualMachineInstance, migrations []*v1alpha1.VirtualMachineInstanceMigration, config *v1alpha1.LifeboatConfig, capacityChanged, now time.Time) Decision {
	var d Decision
	perCluster, perNode := limits(config)
	active, outbound := 0, map[string]int{}
	ahead, aheadOutbound := 0, map[string]int{} // migrations made ahead, waiting for a slot
	preparing := map[string]int{}               // by source node: migrations with a slot whose target is not ready yet
	var waiting []*v1alpha1.VirtualMachineInstanceMigration
	migrating := map[string]bool{}                                       // VMI names (namespace/name) with an unfinished migration
	failures := map[string][]*v1alpha1.VirtualMachineInstanceMigration{} // VMI UID → its failed migrations
	failedUIDs := map[string]bool{}                                      // UIDs of migrations that failed
	byKey := map[string]*v1alpha1.VirtualMachineInstance{}               // VMI names (namespace/name) → VMI
	for _, vmi := range vmis {
		byKey[vmi.Namespace+"/"+vmi.Name] = vmi
	}
	byUID := map[string]*v1alpha1.VirtualMachineInstanceMigration{}
	for _, m := range migrations {
		byUID[string(m.UID)] = m
	}
	underway := map[string][]*v1alpha1.VirtualMachineInstanceMigration{} // by source node: moving memory
	followed := map[string]bool{}                                        // UIDs of migrations under way that one made ahead follows
	for _, m := range migrations {
		key := m.Namespace + "/" + m.Spec.VMIName
		evacuated := string(m.EvacuatedVMI())
		switch m.Status.Phase {
		case v1alpha1.MigrationSucceeded:
		case v1alpha1.MigrationFailed:
			failedUIDs[string(m.UID)] = true
			if evacuated != "" && m.Status.EndTimestamp != nil {
				failures[evacuated] = append(failures[evacuated], m)
			}
		default:
			migrating[key] = true
			if evacuated == "" {
				continue // a person's: the migration controller holds these to a limit of their own
			}
			// A migration the migration controller has not picked up yet has no source node in
			// its status: it leaves from where its VMI runs.
			source := m.Status.SourceNode
			if source == "" && byKey[key] != nil {
				source = byKey[key].Status.NodeName
			}
			if after := m.SlotAfter(); after != "" && transferEnded(byUID[after], byKey) {
				// It has the slot of the one it followed (its source agent may have started it
				// already): only the wait in its status is left to clear.
				if unwanted(m, byKey[key]) {
					d.Withdraw = append(d.Withdraw, m)
					continue
				}
				active++
				outbound[source]++
				d.Release = append(d.Release, m)
				continue
			}
			if m.WaitingForSlot() {
				if after := m.SlotAfter(); after != "" {
					followed[after] = true
				}
				ahead++
				aheadOutbound[source]++
				waiting = append(waiting, m)
				continue
			}
			if arrived(byKey[key], m) {
				continue
			}
			active++
			outbound[source]++
			if targetPending(m) {
				preparing[source]++
			}
			if m.Status.Phase == v1alpha1.MigrationRunning {
				underway[source] = append(underway[source], m)
			}
		}
	}

	// Each candidate, and each migration made ahead with its VMI's urgency.
	type entry struct {
		Candidate
		ahead *v1alpha1.VirtualMachineInstanceMigration // nil: a new candidate
	}
	var entries []entry
	for _, m := range waiting {
		vmi := byKey[m.Namespace+"/"+m.Spec.VMIName]
		if unwanted(m, vmi) {
			d.Withdraw = append(d.Withdraw, m)
			continue
		}
		c := candidate(vmi)
		c.madeAhead = true
		entries = append(entries, entry{Candidate: c, ahead: m})
	}
	for _, vmi := range vmis {
		if !marked(vmi) || migrating[vmi.Namespace+"/"+vmi.Name] || openMigration(vmi, failedUIDs) || vmi.DeletionTimestamp != nil {
			continue
		}
		switch v1alpha1.EffectiveEvictionStrategy(vmi, config) {
		case v1alpha1.EvictionStrategyExternal:
			d.External = append(d.External, vmi)
			continue
		case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible:
			if !migratable(vmi) {
				continue
			}
		default:
			continue
		}
		c := candidate(vmi)
		failed := failedSince(failures[string(vmi.UID)], c.markedAt)
		last := lastOf(failed)
		if last != nil && last.Status.TargetUnschedulable && !capacityChanged.After(last.Status.EndTimestamp.Time) {
			d.AwaitingCapacity = append(d.AwaitingCapacity, Awaiting{VMI: vmi, Failed: last})
			continue
		}
		if wait := backoff(len(failed), last, c.Deadline, now); wait > 0 {
			if d.RetryAfter == 0 || wait < d.RetryAfter {
				d.RetryAfter = wait
			}
			continue
		}
		c.FailedOn = targetNodes(failed)
		entries = append(entries, entry{Candidate: c})
	}
	order := orderedBy(earliestDeadline, causePriority, madeAheadFirst, markedFirst, byName)
	slices.SortStableFunc(entries, func(a, b entry) int { return order(a.Candidate, b.Candidate) })
	blocked := map[string]bool{} // nodes where a new candidate waits for a slot
	for _, e := range entries {
		node := e.VMI.Status.NodeName
		if e.ahead != nil && e.ahead.Status.SourceNode != "" {
			node = e.ahead.Status.SourceNode
		}
		switch {
		case active < perCluster && outbound[node] < perNode:
			active++
			outbound[node]++
			if e.ahead == nil {
				preparing[node]++
				d.Create = append(d.Create, e.Candidate)
				continue
			}
			if targetPending(e.ahead) {
				preparing[node]++
			}
			ahead--
			aheadOutbound[node]--
			d.Release = append(d.Release, e.ahead)
		case e.ahead == nil && preparing[node] == 0 && ahead < perCluster && aheadOutbound[node] < perNode:
			ahead++
			aheadOutbound[node]++
			d.Prepare = append(d.Prepare, e.Candidate)
		case e.ahead == nil:
			blocked[node] = true
		case !blocked[node] && e.ahead.Status.Phase == v1alpha1.MigrationTargetReady && e.ahead.SlotAfter() == "":
			if x := firstUnfollowed(underway[node], followed); x != nil {
				followed[string(x.UID)] = true
				d.Follow = append(d.Follow, Follow{Migration: e.ahead, After: x})
			}
		}
	}
	return d
}

// unwanted reports whether m, made ahead, is no longer its VMI's evacuation: the VMI is gone,
// replaced, no longer marked or being deleted.
func unwanted(m *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi == nil || string(vmi.UID) != string(m.EvacuatedVMI()) || !marked(vmi) || vmi.DeletionTimestamp != nil
}

// transferEnded reports whether migration x (nil: gone) moves no more memory: it ended, or its
// guest runs on its target.
func transferEnded(x *v1alpha1.VirtualMachineInstanceMigration, byKey map[string]*v1alpha1.VirtualMachineInstance) bool {
	return x == nil || x.Status.Phase.Terminal() || arrived(byKey[x.Namespace+"/"+x.Spec.VMIName], x)
}

// firstUnfollowed is the migration under way that started first and that none follows yet; nil
// if every one is followed.
func firstUnfollowed(underway []*v1alpha1.VirtualMachineInstanceMigration, followed map[string]bool) *v1alpha1.VirtualMachineInstanceMigration {
	var first *v1alpha1.VirtualMachineInstanceMigration
	for _, m := range underway {
		if followed[string(m.UID)] {
			continue
		}
		if first == nil || startedBefore(m, first) {
			first = m
		}
	}
	return first
}

// startedBefore orders migrations under way by their start, then by name.
func startedBefore(a, b *v1alpha1.VirtualMachineInstanceMigration) bool {
	var at, bt time.Time
	if a.Status.StartTimestamp != nil {
		at = a.Status.StartTimestamp.Time
	}
	if b.Status.StartTimestamp != nil {
		bt = b.Status.StartTimestamp.Time
	}
	if !at.Equal(bt) {
		return at.Before(bt)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// arrived reports whether m's guest already runs on its target, as its VMI records (the source
// agent writes the VMI first, then the migration's phase). Its memory has moved: what is left is
// that write, and its slot goes to the next migration now rather than one API round trip later,
// at every hand-over of a drain.
func arrived(vmi *v1alpha1.VirtualMachineInstance, m *v1alpha1.VirtualMachineInstanceMigration) bool {
	if vmi == nil || m.Status.TargetNode == "" || vmi.Status.NodeName != m.Status.TargetNode {
		return false
	}
	s := vmi.Status.MigrationState
	return s != nil && s.MigrationUID == string(m.UID) && s.Completed
}

// targetPending reports whether an unfinished migration's target is not ready yet.
func targetPending(m *v1alpha1.VirtualMachineInstanceMigration) bool {
	switch m.Status.Phase {
	case "", v1alpha1.MigrationPending, v1alpha1.MigrationScheduling, v1alpha1.MigrationScheduled, v1alpha1.MigrationPreparingTarget:
		return true
	}
	return false
}

func limits(config *v1alpha1.LifeboatConfig) (perCluster, perNode int) {
	perCluster, perNode = 5, 2
	if config == nil {
		return
	}
	if p := config.Spec.Migrations.ParallelMigrationsPerCluster; p != nil {
		perCluster = int(*p)
	}
	if p := config.Spec.Migrations.ParallelOutboundMigrationsPerNode; p != nil {
		perNode = int(*p)
	}
	return
}

func marked(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi.Status.Phase == v1alpha1.VMIRunning && vmi.MarkedForEvacuation()
}

// openMigration: the VMI records a migration that has not ended (its record may be written
// before or after the migration object's). A migration that failed while its source agent was
// down ends on the migration object only, so that one's word counts too. A success does not:
// its agent writes it on the VMI first, so a VMI that does not show it yet is a cache behind
// (a restarted controller's lists, or a watch late under load), still marked on the node it
// left, and another migration would move the VM back.
func openMigration(vmi *v1alpha1.VirtualMachineInstance, failed map[string]bool) bool {
	s := vmi.Status.MigrationState
	return s != nil && !s.Completed && !s.Failed && !failed[s.MigrationUID]
}

func migratable(vmi *v1alpha1.VirtualMachineInstance) bool {
	ok, _ := vmi.LiveMigratable()
	return ok
}

// candidate reads the cause from the EvictionRequested condition's reason, which every path
// that marks a VMI sets (the agent: NodePressure; the webhook: APIEviction; ...).
func candidate(vmi *v1alpha1.VirtualMachineInstance) Candidate {
	c := Candidate{VMI: vmi, Cause: v1alpha1.MigrationCauseManual, Deadline: vmi.Status.EvacuationDeadline}
	if cond := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); cond != nil && cond.Status == metav1.ConditionTrue {
		c.markedAt = cond.LastTransitionTime.Time
		if cause := v1alpha1.MigrationCause(cond.Reason); cause.Recorded() {
			c.Cause = cause
		}
	}
	return c
}

// failedSince are the failed migrations that ended after the mark: failures of an earlier
// evacuation do not count against this one.
func failedSince(failed []*v1alpha1.VirtualMachineInstanceMigration, markedAt time.Time) []*v1alpha1.VirtualMachineInstanceMigration {
	var since []*v1alpha1.VirtualMachineInstanceMigration
	for _, m := range failed {
		if !m.Status.EndTimestamp.Before(&metav1.Time{Time: markedAt}) {
			since = append(since, m)
		}
	}
	return since
}

// lastOf is the migration that ended last, nil if none.
func lastOf(failed []*v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	var last *v1alpha1.VirtualMachineInstanceMigration
	for _, m := range failed {
		if last == nil || m.Status.EndTimestamp.After(last.Status.EndTimestamp.Time) {
			last = m
		}
	}
	return last
}

// backoff is how long a VMI must still wait after n failed migrations, the last of which is
// last; deadline is its evacuation's (nil: none).
func backoff(n int, last *v1alpha1.VirtualMachineInstanceMigration, deadline *metav1.Time, now time.Time) time.Duration {
	if last == nil {
		return 0
	}
	wait := min(backoffBase<<min(n-1, 10), backoffMax)
	if deadline != nil && now.Before(deadline.Time) {
		wait = min(wait, beforeDeadline)
	}
	return max(wait-now.Sub(last.Status.EndTimestamp.Time), 0)
}

// targetNodes are the nodes failed placed their targets on, sorted, each once.
func targetNodes(failed []*v1alpha1.VirtualMachineInstanceMigration) []string {
	var nodes []string
	for _, m := range failed {
		if n := m.Status.TargetNode; n != "" && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// less compares two candidates: negative when a goes first.
type less func(a, b Candidate) int

// orderedBy composes comparators: the first that tells them apart decides.
func orderedBy(cmps ...less) func(a, b Candidate) int {
	return func(a, b Candidate) int {
		for _, c := range cmps {
			if r := c(a, b); r != 0 {
				return r
			}
		}
		return 0
	}
}

// earliestDeadline: a deadline goes before none, an earlier one before a later one.
func earliestDeadline(a, b Candidate) int {
	switch {
	case a.Deadline == nil && b.Deadline == nil:
		return 0
	case a.Deadline == nil:
		return 1
	case b.Deadline == nil:
		return -1
	}
	return a.Deadline.Time.Compare(b.Deadline.Time)
}

// causePriority: node pressure and deleted pods first (the kubelet will kill), then relief (which
// keeps the kubelet from having to), then drains, then the rest.
func causePriority(a, b Candidate) int {
	rank := func(c v1alpha1.MigrationCause) int {
		switch c {
		case v1alpha1.MigrationCauseNodePressure, v1alpha1.MigrationCausePodDeleted:
			return 0
		case v1alpha1.MigrationCauseNodePressureRelief:
			return 1
		case v1alpha1.MigrationCauseDrain:
			return 2
		}
		return 3
	}
	return cmp.Compare(rank(a.Cause), rank(b.Cause))
}

// madeAheadFirst: a candidate whose migration was made ahead (its target prepared) goes first.
func madeAheadFirst(a, b Candidate) int {
	switch {
	case a.madeAhead == b.madeAhead:
		return 0
	case a.madeAhead:
		return -1
	}
	return 1
}

func markedFirst(a, b Candidate) int { return a.markedAt.Compare(b.markedAt) }

func byName(a, b Candidate) int {
	return cmp.Compare(a.VMI.Namespace+"/"+a.VMI.Name, b.VMI.Namespace+"/"+b.VMI.Name)
}
