// Package check is the soak's independent checker: it reads only what a user of lifeboat can
// observe (what the guests print on their consoles, what they answer through a Service, what
// their journals say was committed, and snapshots of the API), never lifeboat's internals, and
// says what went wrong: two copies of one guest, a guest that rebooted when nobody asked, a
// journal that lost a committed write, a LiveMigrate VM that is not running once the cluster
// settles, anything stuck past its limit, and a VM lost without a fault that makes it unavoidable.
//
// Everything here is a pure function of a recorded History, so a failure can be staged from
// recorded observations and replayed.
package check

import (
	"fmt"
	"sort"
	"time"
)

// Console is one reading of a guest's serial console: the last counter line it held at At.
// Stream names the console log read, one launcher pod's: a migration's target has a stream of its
// own, also on a node the instance ran on before, and a counter goes back only within one stream.
type Console struct {
	At       time.Time
	VM       string
	Instance string // the VMI's UID
	Node     string
	Stream   string
	Counter  int // the last counter line; 0 when there is none yet
}

// Answer is what a guest answered through its Service: its boot's random identity and counter.
// Instance is empty when the asker cannot tell which instance answered (a Service picks one of
// its endpoints).
type Answer struct {
	At       time.Time
	VM       string
	Instance string
	Boot     string
	Counter  int
}

// Journal is what a guest said of its journal: entries 1..Through read back intact, or an error.
type Journal struct {
	At       time.Time
	VM       string
	Instance string
	Through  int
	Err      string
}

// VM is a VirtualMachine as one API snapshot saw it.
type VM struct {
	Name string
	// Instance is its VMI's UID, empty when it has none.
	Instance string
	Phase    string
	Node     string
	// LiveMigrate says its eviction strategy is LiveMigrate: it must survive every fault but
	// those that make loss unavoidable.
	LiveMigrate bool
	// WantRunning says its owner wants it running (its run strategy is not Halted and it was not stopped).
	WantRunning bool
}

// Snapshot is what the API showed at one moment.
type Snapshot struct {
	At         time.Time
	VMs        []VM
	Holds      []Hold
	Migrations []Migration
}

// Migration is a VirtualMachineInstanceMigration as one snapshot saw it.
type Migration struct {
	Name  string
	VM    string
	Cause string
	Phase string
}

// HoldKind is a kind of thing that must not last: each is normal for a while and a defect past its limit.
type HoldKind string

const (
	// HoldMark is a VMI marked for evacuation (status.evacuationNodeName) and not moved yet.
	HoldMark HoldKind = "mark"
	// HoldMigration is a migration that has not ended.
	HoldMigration HoldKind = "migration"
	// HoldBudget is a VM's disruption budget still expanded for a migration (minAvailable 2 or more).
	HoldBudget HoldKind = "budget"
	// HoldTargetPod is a migration target pod that has not started or ended.
	HoldTargetPod HoldKind = "target-pod"
	// HoldCordon is a node cordoned by something else than the user (the soak).
	HoldCordon HoldKind = "cordon"
	// HoldEviction is an Eviction (an EvictionRequest's) whose active responder is lifeboat and
	// that lifeboat has not answered (no completionTime) while its pod still runs.
	HoldEviction HoldKind = "eviction"
)

// Hold is one thing of a HoldKind, named so that the same one is recognised from snapshot to snapshot.
type Hold struct {
	Kind HoldKind
	Name string
}

// Action is something the soak did: an operation a user would do, or a fault it injected.
type Action struct {
	At   time.Time
	Kind string
	VM   string // the VM it aimed at, if any
	Node string // the node it aimed at, if any
	// Restart says the user asked for the VM's instance to end (stop, restart, delete): a new
	// instance after it is no loss.
	Restart bool
	// Fatal says the fault may end the VM's guest whatever lifeboat does (its QEMU killed, its
	// node lost): a new instance after it is a loss, but an unavoidable one.
	Fatal bool
	// Ends names the kind of action this one ends (a killed process started again, a frozen node
	// resumed, a stopped VM started): the report counts it with the action, not on its own.
	Ends string
}

// Limits are how long things may last.
type Limits struct {
	// Hold is how long each kind of Hold may last.
	Hold map[HoldKind]time.Duration
	// Overlap is how long two consoles of one VM on two nodes may both count in the same
	// interval before that is two copies: the readings' own granularity (a console is read every
	// so often, so a migration's source and target can look as if they counted together for up
	// to one reading period).
	Overlap time.Duration
	// Gap is the longest pause between two counter increases of one console that still counts
	// as one stretch of counting.
	Gap time.Duration
	// Blame is how long after a fatal fault a VM's new instance is blamed on it.
	Blame time.Duration
	// Tick is how often the guests count.
	Tick time.Duration
	// Answer is how long before the settled snapshot a VM served through a Service must have
	// answered through it last.
	Answer time.Duration
}

// DefaultLimits are the soak's.
func DefaultLimits() Limits {
	return Limits{
		Hold: map[HoldKind]time.Duration{
			HoldMark: 5 * time.Minute, HoldMigration: 5 * time.Minute, HoldBudget: 5 * time.Minute,
			HoldTargetPod: 5 * time.Minute, HoldCordon: 2 * time.Minute, HoldEviction: 5 * time.Minute,
		},
		Overlap: 3 * time.Second,
		Gap:     5 * time.Second,
		Blame:   5 * time.Minute,
		Tick:    time.Second,
		Answer:  10 * time.Second,
	}
}

// History is everything a soak recorded, in any order.
type History struct {
	Consoles  []Console
	Answers   []Answer
	Journals  []Journal
	Snapshots []Snapshot
	Actions   []Action
	// Settled is the snapshot taken after the last fault, once the cluster had time to settle:
	// every LiveMigrate VM its owner wants running must run in it. Nil if the soak took none.
	Settled *Snapshot
	// Served says every VM is served through a Service the soak asked: each LiveMigrate VM its
	// owner wants running must have answered through it lately once the cluster settled.
	Served bool
}

// Kind is a kind of violation.
type Kind string

const (
	TwoCopies   Kind = "TwoCopies"
	Reboot      Kind = "Reboot"
	JournalLoss Kind = "JournalLoss"
	NotRunning  Kind = "NotRunning"
	Stuck       Kind = "Stuck"
	Lost        Kind = "Lost"
	NoAnswer    Kind = "NoAnswer"
)

// Violation is one thing that went wrong, said so that it can be found in the soak's logs.
type Violation struct {
	Kind Kind
	VM   string
	At   time.Time
	What string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s %s at %s: %s", v.Kind, v.VM, v.At.UTC().Format("15:04:05.000"), v.What)
}

// Check returns every violation in h, ordered by time.
func Check(h History, l Limits) []Violation {
	var out []Violation
	out = append(out, twoCopies(h.Consoles, l)...)
	out = append(out, twoBootsAnswering(h.Answers, l)...)
	if h.Served {
		out = append(out, notAnswering(h.Answers, h.Settled, l)...)
	}
	out = append(out, reboots(h.Consoles, h.Answers)...)
	out = append(out, journalLosses(h.Journals)...)
	out = append(out, notRunning(h.Settled)...)
	out = append(out, stuck(h.Snapshots, l)...)
	for _, loss := range Losses(h, l) {
		if loss.Fault == nil {
			out = append(out, Violation{Kind: Lost, VM: loss.VM, At: loss.At,
				What: fmt.Sprintf("instance %s ended and %s replaced it, with no restart asked and no fatal fault before", loss.Old, loss.New)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// span is a stretch of time during which a console counted.
type span struct{ from, to time.Time }

// countingSpans are the stretches during which one console's counter rose: between two readings
// whose counter rose, merged where they follow each other within gap.
func countingSpans(readings []Console, gap time.Duration) []span {
	var out []span
	for i := 1; i < len(readings); i++ {
		prev, cur := readings[i-1], readings[i]
		// A rise across a long wait between readings may be a stop and a start: not counted.
		if cur.Counter <= prev.Counter || prev.Counter == 0 || cur.At.Sub(prev.At) > gap {
			continue
		}
		if n := len(out); n > 0 && prev.At.Sub(out[n-1].to) <= gap {
			out[n-1].to = cur.At
			continue
		}
		out = append(out, span{prev.At, cur.At})
	}
	return out
}

// streams groups readings by VM and stream, each in time order.
func streams(consoles []Console) map[string]map[string][]Console {
	out := map[string]map[string][]Console{}
	for _, c := range consoles {
		if out[c.VM] == nil {
			out[c.VM] = map[string][]Console{}
		}
		out[c.VM][c.Stream] = append(out[c.VM][c.Stream], c)
	}
	for _, byStream := range out {
		for _, r := range byStream {
			sort.SliceStable(r, func(i, j int) bool { return r[i].At.Before(r[j].At) })
		}
	}
	return out
}

// twoCopies finds two consoles of one VM, on two nodes, counting in the same interval for longer
// than the readings' granularity explains.
func twoCopies(consoles []Console, l Limits) []Violation {
	var out []Violation
	for vm, byStream := range streams(consoles) {
		names := make([]string, 0, len(byStream))
		for s := range byStream {
			names = append(names, s)
		}
		sort.Strings(names)
		for i, a := range names {
			for _, b := range names[i+1:] {
				ra, rb := byStream[a], byStream[b]
				if ra[0].Node == rb[0].Node {
					continue
				}
				for _, sa := range countingSpans(ra, l.Gap) {
					for _, sb := range countingSpans(rb, l.Gap) {
						from, to := later(sa.from, sb.from), earlier(sa.to, sb.to)
						if to.Sub(from) > l.Overlap {
							out = append(out, Violation{Kind: TwoCopies, VM: vm, At: from, What: fmt.Sprintf(
								"counting on %s (instance %s) and on %s (instance %s) at once for %s",
								ra[0].Node, ra[0].Instance, rb[0].Node, rb[0].Instance, to.Sub(from).Round(time.Millisecond))})
						}
					}
				}
			}
		}
	}
	return out
}

// twoBootsAnswering finds a VM whose Service answered from two boots of its guest in the same
// stretch of time (longer than the readings' granularity): two copies, each an endpoint of the
// Service. A restart's new boot answers only after the old one's last answer.
func twoBootsAnswering(answers []Answer, l Limits) []Violation {
	type key struct{ vm, boot string }
	spans := map[key]*span{}
	var keys []key
	for _, a := range answers {
		k := key{a.VM, a.Boot}
		sp := spans[k]
		if sp == nil {
			spans[k] = &span{a.At, a.At}
			keys = append(keys, k)
			continue
		}
		sp.from, sp.to = earlier(sp.from, a.At), later(sp.to, a.At)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].vm != keys[j].vm {
			return keys[i].vm < keys[j].vm
		}
		return keys[i].boot < keys[j].boot
	})
	var out []Violation
	for i, a := range keys {
		for _, b := range keys[i+1:] {
			if a.vm != b.vm {
				continue
			}
			sa, sb := spans[a], spans[b]
			from, to := later(sa.from, sb.from), earlier(sa.to, sb.to)
			if to.Sub(from) > l.Overlap {
				out = append(out, Violation{Kind: TwoCopies, VM: a.vm, At: from, What: fmt.Sprintf(
					"answering through its Service from boot %s and from boot %s at once for %s", a.boot, b.boot, to.Sub(from).Round(time.Millisecond))})
			}
		}
	}
	return out
}

// notAnswering finds the LiveMigrate VMs their owners want running that had not answered
// through their Services within l.Answer before the cluster settled.
func notAnswering(answers []Answer, settled *Snapshot, l Limits) []Violation {
	if settled == nil {
		return nil
	}
	last := map[string]time.Time{}
	for _, a := range answers {
		if !a.At.After(settled.At) {
			last[a.VM] = later(last[a.VM], a.At)
		}
	}
	var out []Violation
	for _, vm := range settled.VMs {
		if !vm.LiveMigrate || !vm.WantRunning {
			continue
		}
		if at, ok := last[vm.Name]; !ok || settled.At.Sub(at) > l.Answer {
			since := "never"
			if ok {
				since = "last at " + at.UTC().Format("15:04:05.000")
			}
			out = append(out, Violation{Kind: NoAnswer, VM: vm.Name, At: settled.At, What: fmt.Sprintf(
				"no answer through its Service in the %s before the cluster settled (%s)", l.Answer, since)})
		}
	}
	return out
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// rebootSlack is how far below what the instance already counted a new console may start: a
// migration's target shows the counter where the source left it, give or take a line in flight.
const rebootSlack = 2

// reboots finds an instance whose guest booted again: a console whose counter went back, a new
// console of the instance starting well below what it had counted, or two boot identities in
// its answers. A new instance is not a reboot (Losses judges it).
func reboots(consoles []Console, answers []Answer) []Violation {
	var out []Violation
	byInstance := map[string][]Console{}
	for _, c := range consoles {
		if c.Counter > 0 {
			byInstance[c.Instance] = append(byInstance[c.Instance], c)
		}
	}
	instances := make([]string, 0, len(byInstance))
	for i := range byInstance {
		instances = append(instances, i)
	}
	sort.Strings(instances)
	for _, instance := range instances {
		r := byInstance[instance]
		sort.SliceStable(r, func(i, j int) bool { return r[i].At.Before(r[j].At) })
		highest, last := 0, map[string]int{}
		for _, c := range r {
			prev, seen := last[c.Stream]
			switch {
			case seen && c.Counter < prev:
				out = append(out, Violation{Kind: Reboot, VM: c.VM, At: c.At, What: fmt.Sprintf(
					"instance %s's counter on %s went back from %d to %d", instance, c.Node, prev, c.Counter)})
			case !seen && c.Counter < highest-rebootSlack:
				out = append(out, Violation{Kind: Reboot, VM: c.VM, At: c.At, What: fmt.Sprintf(
					"instance %s's new console on %s starts at %d after it had counted to %d", instance, c.Node, c.Counter, highest)})
			}
			last[c.Stream] = c.Counter
			highest = max(highest, c.Counter)
		}
	}
	sort.SliceStable(answers, func(i, j int) bool { return answers[i].At.Before(answers[j].At) })
	boot := map[string]string{}
	for _, a := range answers {
		// An answer of no known instance: a boot change may be a restart (twoBootsAnswering
		// judges these).
		if a.Instance == "" {
			continue
		}
		if b, ok := boot[a.Instance]; ok && b != a.Boot {
			out = append(out, Violation{Kind: Reboot, VM: a.VM, At: a.At, What: fmt.Sprintf(
				"instance %s answered with boot %s, then with boot %s", a.Instance, b, a.Boot)})
		}
		boot[a.Instance] = a.Boot
	}
	return out
}

// journalLosses finds a journal that reported an error, or reported fewer committed entries than
// it had before within one instance.
func journalLosses(journals []Journal) []Violation {
	var out []Violation
	sort.SliceStable(journals, func(i, j int) bool { return journals[i].At.Before(journals[j].At) })
	committed := map[string]int{}
	for _, j := range journals {
		switch {
		case j.Err != "":
			out = append(out, Violation{Kind: JournalLoss, VM: j.VM, At: j.At, What: fmt.Sprintf("instance %s's journal: %s", j.Instance, j.Err)})
		case j.Through < committed[j.Instance]:
			out = append(out, Violation{Kind: JournalLoss, VM: j.VM, At: j.At, What: fmt.Sprintf(
				"instance %s's journal holds 1..%d after it had committed 1..%d", j.Instance, j.Through, committed[j.Instance])})
		}
		committed[j.Instance] = max(committed[j.Instance], j.Through)
	}
	return out
}

// notRunning finds the LiveMigrate VMs their owners want running that do not run once the cluster settled.
func notRunning(settled *Snapshot) []Violation {
	if settled == nil {
		return nil
	}
	var out []Violation
	for _, vm := range settled.VMs {
		if vm.LiveMigrate && vm.WantRunning && vm.Phase != "Running" {
			phase := vm.Phase
			if vm.Instance == "" {
				phase = "without an instance"
			}
			out = append(out, Violation{Kind: NotRunning, VM: vm.Name, At: settled.At, What: fmt.Sprintf("%s once the cluster settled", phase)})
		}
	}
	return out
}

// stuck finds holds that lasted, from snapshot to snapshot, past their limit.
func stuck(snapshots []Snapshot, l Limits) []Violation {
	sort.SliceStable(snapshots, func(i, j int) bool { return snapshots[i].At.Before(snapshots[j].At) })
	since := map[Hold]time.Time{}
	reported := map[Hold]bool{}
	var out []Violation
	for _, s := range snapshots {
		now := map[Hold]bool{}
		for _, h := range s.Holds {
			now[h] = true
			first, ok := since[h]
			if !ok {
				since[h] = s.At
				continue
			}
			if limit, ok := l.Hold[h.Kind]; ok && s.At.Sub(first) > limit && !reported[h] {
				reported[h] = true
				out = append(out, Violation{Kind: Stuck, VM: h.Name, At: s.At, What: fmt.Sprintf(
					"%s %s held since %s, past its limit of %s", h.Kind, h.Name, first.UTC().Format("15:04:05"), limit)})
			}
		}
		for h := range since {
			if !now[h] {
				delete(since, h)
				delete(reported, h)
			}
		}
	}
	return out
}
