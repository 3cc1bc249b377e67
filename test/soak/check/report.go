package check

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Loss is a VM whose instance ended without its owner asking: replaced by a new one (its run
// strategy started it again) or ended for good.
type Loss struct {
	VM       string
	At       time.Time
	Old, New string // New is empty when nothing replaced it
	// Fault is the fatal fault that makes the loss unavoidable, nil if none came before it.
	Fault *Action
}

// Losses are the VMs' instances that ended without a restart their owners asked for.
func Losses(h History, l Limits) []Loss {
	snapshots := append([]Snapshot(nil), h.Snapshots...)
	if h.Settled != nil {
		snapshots = append(snapshots, *h.Settled)
	}
	sort.SliceStable(snapshots, func(i, j int) bool { return snapshots[i].At.Before(snapshots[j].At) })
	type seen struct {
		instance, node string
		first          time.Time
		ended          bool
	}
	current := map[string]*seen{}
	var out []Loss
	judge := func(vm string, old *seen, newInstance string, at time.Time) {
		for _, a := range h.Actions {
			if a.Restart && a.VM == vm && !a.At.Before(old.first) && !a.At.After(at) {
				return
			}
		}
		loss := Loss{VM: vm, At: at, Old: old.instance, New: newInstance}
		for i := len(h.Actions) - 1; i >= 0; i-- {
			a := h.Actions[i]
			if a.Fatal && !a.At.After(at) && at.Sub(a.At) <= l.Blame && (a.VM == vm || (a.Node != "" && a.Node == old.node)) {
				loss.Fault = &h.Actions[i]
				break
			}
		}
		out = append(out, loss)
	}
	for _, s := range snapshots {
		for _, vm := range s.VMs {
			cur := current[vm.Name]
			if vm.Instance == "" {
				continue
			}
			if cur == nil || cur.instance != vm.Instance {
				if cur != nil && !cur.ended {
					judge(vm.Name, cur, vm.Instance, s.At)
				}
				current[vm.Name] = &seen{instance: vm.Instance, node: vm.Node, first: s.At}
				cur = current[vm.Name]
			}
			if vm.Node != "" {
				cur.node = vm.Node
			}
			if !cur.ended && (vm.Phase == "Failed" || vm.Phase == "Succeeded") {
				cur.ended = true
				judge(vm.Name, cur, "", s.At)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Stop is the longest a VM's guest stood still, as its consoles showed it.
type Stop struct {
	VM       string
	Instance string
	Length   time.Duration
	Ended    time.Time
}

// LongestStops is, per VM, the longest its counter stood still beyond its tick while one instance
// ran: from the first reading of a counter to the first reading of a higher one, on whichever of
// the instance's consoles.
func LongestStops(consoles []Console, tick time.Duration) []Stop {
	byInstance := map[string][]Console{}
	for _, c := range consoles {
		if c.Counter > 0 {
			byInstance[c.Instance] = append(byInstance[c.Instance], c)
		}
	}
	worst := map[string]Stop{}
	for instance, r := range byInstance {
		sort.SliceStable(r, func(i, j int) bool { return r[i].At.Before(r[j].At) })
		highest, at := 0, time.Time{}
		for _, c := range r {
			if c.Counter <= highest {
				continue
			}
			if highest > 0 {
				stood := c.At.Sub(at) - time.Duration(c.Counter-highest)*tick
				if stood > worst[c.VM].Length {
					worst[c.VM] = Stop{VM: c.VM, Instance: instance, Length: stood, Ended: c.At}
				}
			}
			highest, at = c.Counter, c.At
		}
	}
	out := make([]Stop, 0, len(worst))
	for _, s := range worst {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Length > out[j].Length })
	return out
}

// Report is a soak's figures.
type Report struct {
	Operations map[string]int // by kind, the user's operations
	Faults     map[string]int // by kind
	// Migrations counts migrations by the last phase a snapshot saw them in.
	Migrations map[string]int
	Stops      []Stop
	Losses     []Loss
	TwoCopies  int
	// Answers counts the answers through Services, -1 when the VMs were not served.
	Answers int
	// LastFault is when the last fault ended; Settle how long after it the cluster settled for
	// good (every LiveMigrate VM its owner wants running running, nothing held, in every snapshot
	// from then on), negative if it never did.
	LastFault  time.Time
	Settle     time.Duration
	Violations []Violation
}

// Summarise computes the figures of h; faults are the action kinds that are faults.
func Summarise(h History, l Limits, faults map[string]bool) Report {
	r := Report{Operations: map[string]int{}, Faults: map[string]int{}, Migrations: map[string]int{}, Settle: -1, Answers: -1}
	if h.Served {
		r.Answers = len(h.Answers)
	}
	for _, a := range h.Actions {
		if a.Ends != "" {
			// A fault lasts until its end: the cluster settles after that.
			if faults[a.Ends] && a.At.After(r.LastFault) {
				r.LastFault = a.At
			}
			continue
		}
		if faults[a.Kind] {
			r.Faults[a.Kind]++
			if a.At.After(r.LastFault) {
				r.LastFault = a.At
			}
		} else {
			r.Operations[a.Kind]++
		}
	}
	snapshots := append([]Snapshot(nil), h.Snapshots...)
	if h.Settled != nil {
		snapshots = append(snapshots, *h.Settled)
	}
	sort.SliceStable(snapshots, func(i, j int) bool { return snapshots[i].At.Before(snapshots[j].At) })
	phase := map[string]string{}
	// Settled from the first snapshot of the last settled stretch: a moment of calm between a
	// fault and what it set off does not count.
	var stretch time.Time
	for _, s := range snapshots {
		for _, m := range s.Migrations {
			phase[m.Name] = m.Phase
		}
		if s.At.Before(r.LastFault) {
			continue
		}
		switch {
		case !settled(s):
			stretch = time.Time{}
		case stretch.IsZero():
			stretch = s.At
		}
	}
	if !stretch.IsZero() {
		r.Settle = stretch.Sub(r.LastFault)
	}
	for _, p := range phase {
		r.Migrations[p]++
	}
	r.Stops = LongestStops(h.Consoles, l.Tick)
	r.Losses = Losses(h, l)
	r.Violations = Check(h, l)
	for _, v := range r.Violations {
		if v.Kind == TwoCopies {
			r.TwoCopies++
		}
	}
	return r
}

// settled says every LiveMigrate VM its owner wants running runs and nothing is held.
func settled(s Snapshot) bool {
	for _, vm := range s.VMs {
		if vm.LiveMigrate && vm.WantRunning && vm.Phase != "Running" {
			return false
		}
	}
	return len(s.Holds) == 0
}

// Print writes the report as a soak prints it at its end.
func (r Report) Print(w io.Writer) {
	fmt.Fprintln(w, "soak report")
	fmt.Fprintf(w, "  operations: %s\n", counts(r.Operations))
	fmt.Fprintf(w, "  faults:     %s\n", counts(r.Faults))
	fmt.Fprintf(w, "  migrations by outcome: %s\n", counts(r.Migrations))
	if len(r.Stops) > 0 {
		s := r.Stops[0]
		fmt.Fprintf(w, "  longest stop a guest saw: %s (VM %s, instance %s, ended %s)\n", s.Length.Round(time.Millisecond), s.VM, s.Instance, s.Ended.UTC().Format("15:04:05"))
	} else {
		fmt.Fprintln(w, "  longest stop a guest saw: none seen")
	}
	fmt.Fprintf(w, "  VMs lost: %d\n", len(r.Losses))
	for _, l := range r.Losses {
		why := "NO fault makes it unavoidable"
		if l.Fault != nil {
			why = fmt.Sprintf("after %s at %s", l.Fault.Kind, l.Fault.At.UTC().Format("15:04:05"))
		}
		fmt.Fprintf(w, "    %s at %s: instance %s ended (replaced by %q), %s\n", l.VM, l.At.UTC().Format("15:04:05"), l.Old, l.New, why)
	}
	fmt.Fprintf(w, "  two-copy events: %d\n", r.TwoCopies)
	if r.Answers >= 0 {
		fmt.Fprintf(w, "  answers through Services: %d\n", r.Answers)
	}
	switch {
	case r.LastFault.IsZero():
		fmt.Fprintln(w, "  settle after the last fault: no fault injected")
	case r.Settle < 0:
		fmt.Fprintf(w, "  settle after the last fault (%s): never\n", r.LastFault.UTC().Format("15:04:05"))
	default:
		fmt.Fprintf(w, "  settle after the last fault (%s): %s\n", r.LastFault.UTC().Format("15:04:05"), r.Settle.Round(time.Second))
	}
	fmt.Fprintf(w, "  violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(w, "    %s\n", v)
	}
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
