package check

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 28, 5, 0, 0, 0, time.UTC)

func at(seconds float64) time.Time { return t0.Add(time.Duration(seconds * float64(time.Second))) }

// counting is what a console read every half second shows of a guest counting once a second
// from first, from second from to second to (inclusive).
func counting(vm, instance, node string, from, to float64, first int) []Console {
	var out []Console
	for s := from; s <= to; s += 0.5 {
		out = append(out, Console{At: at(s), VM: vm, Instance: instance, Node: node, Stream: node + "/" + instance,
			Counter: first + int(s-from)})
	}
	return out
}

// still is what the console of a guest that stopped counting at n keeps showing.
func still(vm, instance, node string, from, to float64, n int) []Console {
	var out []Console
	for s := from; s <= to; s += 0.5 {
		out = append(out, Console{At: at(s), VM: vm, Instance: instance, Node: node, Stream: node + "/" + instance, Counter: n})
	}
	return out
}

func join(parts ...[]Console) []Console {
	var out []Console
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func vm(instance, phase, node string) VM {
	return VM{Name: "ns/a", Instance: instance, Phase: phase, Node: node, LiveMigrate: true, WantRunning: true}
}

// clean is a history with nothing wrong: VM ns/a counts on n1, migrates to n2 (a second's stop),
// migrates back to n1, and is restarted by its owner into a new instance; its journal grows;
// a migration is held a while and ends; the cluster settles.
func clean() History {
	consoles := join(
		counting("ns/a", "i1", "n1", 0, 20, 1),
		still("ns/a", "i1", "n1", 20.5, 40, 21),
		counting("ns/a", "i1", "n2", 21.5, 40, 22),
		still("ns/a", "i1", "n2", 40.5, 60, 40),
		// Back to n1: the target's console is a new stream on the same node.
		[]Console{},
	)
	for _, c := range counting("ns/a", "i1", "n1", 41, 60, 41) {
		c.Stream = "n1/i1/back"
		consoles = append(consoles, c)
	}
	consoles = append(consoles, counting("ns/a", "i2", "n3", 70, 90, 1)...)
	return History{
		Consoles: consoles,
		Answers: []Answer{
			{At: at(5), VM: "ns/a", Instance: "i1", Boot: "b1", Counter: 5},
			{At: at(30), VM: "ns/a", Instance: "i1", Boot: "b1", Counter: 30},
			{At: at(80), VM: "ns/a", Instance: "i2", Boot: "b2", Counter: 10},
		},
		Journals: []Journal{
			{At: at(5), VM: "ns/a", Instance: "i1", Through: 5},
			{At: at(25), VM: "ns/a", Instance: "i1", Through: 25},
			{At: at(50), VM: "ns/a", Instance: "i1", Through: 50},
			{At: at(80), VM: "ns/a", Instance: "i2", Through: 10},
		},
		Snapshots: []Snapshot{
			{At: at(0), VMs: []VM{vm("i1", "Running", "n1")}},
			{At: at(20), VMs: []VM{vm("i1", "Running", "n1")}, Holds: []Hold{{HoldMigration, "ns/m1"}},
				Migrations: []Migration{{Name: "ns/m1", VM: "ns/a", Phase: "Running"}}},
			{At: at(30), VMs: []VM{vm("i1", "Running", "n2")}, Migrations: []Migration{{Name: "ns/m1", VM: "ns/a", Phase: "Succeeded"}}},
			{At: at(65), VMs: []VM{vm("i1", "Running", "n1")}},
			{At: at(75), VMs: []VM{vm("i2", "Running", "n3")}},
		},
		Actions: []Action{
			{At: at(18), Kind: "agent-kill", Node: "n1"},
			{At: at(66), Kind: "restart", VM: "ns/a", Restart: true},
		},
		Settled: &Snapshot{At: at(95), VMs: []VM{vm("i2", "Running", "n3")}},
	}
}

func TestACleanHistoryPasses(t *testing.T) {
	if v := Check(clean(), DefaultLimits()); len(v) != 0 {
		t.Fatalf("a clean history has violations: %v", v)
	}
	// Served, answering until the cluster settled; a restart's new boot after the old one's last answer.
	h := clean()
	h.Served = true
	h.Answers = append(h.Answers, Answer{At: at(90), VM: "ns/a", Boot: "b2", Counter: 20})
	if v := Check(h, DefaultLimits()); len(v) != 0 {
		t.Fatalf("a clean served history has violations: %v", v)
	}
}

// Each staged failure is the clean history with one thing gone wrong, as its recorded
// observations would show it; the checker must name exactly that.
func TestTheCheckerCatchesEachStagedFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stage func(h *History)
		want  Kind
		says  string
	}{{
		name: "the source guest counts on after the switch-over: two copies of one instance",
		stage: func(h *History) {
			var kept []Console
			for _, c := range h.Consoles {
				if c.Stream != "n1/i1" || c.At.Before(at(20.5)) {
					kept = append(kept, c)
				}
			}
			h.Consoles = append(kept, counting("ns/a", "i1", "n1", 20.5, 30, 21)...)
		},
		want: TwoCopies, says: "counting on n1 (instance i1) and on n2 (instance i1) at once",
	}, {
		name: "a frozen node resumes and its old guest counts beside the one its run strategy restarted",
		stage: func(h *History) {
			h.Consoles = append(h.Consoles, counting("ns/a", "i1", "n1", 75, 85, 61)...)
		},
		want: TwoCopies, says: "instance i1) and on n3 (instance i2) at once",
	}, {
		name: "the guest reboots in place: its console's counter starts again",
		stage: func(h *History) {
			h.Consoles = append(h.Consoles, Console{At: at(60.2), VM: "ns/a", Instance: "i1", Node: "n1", Stream: "n1/i1/back", Counter: 1})
		},
		want: Reboot, says: "went back from 60 to 1",
	}, {
		name: "the guest boots afresh on the target of a migration: same instance, counter from 1",
		stage: func(h *History) {
			for i := range h.Consoles {
				if h.Consoles[i].Stream == "n2/i1" {
					h.Consoles[i].Counter -= 21
				}
			}
		},
		want: Reboot, says: "new console on n2 starts at 1 after it had counted to 21",
	}, {
		name: "the guest answers through its Service with another boot identity",
		stage: func(h *History) {
			h.Answers = append(h.Answers, Answer{At: at(45), VM: "ns/a", Instance: "i1", Boot: "b9", Counter: 3})
		},
		want: Reboot, says: "answered with boot b1, then with boot b9",
	}, {
		name: "the VM's Service answers from two boots at once: two copies, each an endpoint",
		stage: func(h *History) {
			h.Answers = append(h.Answers, Answer{At: at(86), VM: "ns/a", Boot: "b2", Counter: 16},
				Answer{At: at(90), VM: "ns/a", Boot: "b1", Counter: 88})
		},
		want: TwoCopies, says: "answering through its Service from boot b1 and from boot b2 at once for 6s",
	}, {
		name:  "a served VM does not answer through its Service once the cluster settled",
		stage: func(h *History) { h.Served = true },
		want:  NoAnswer, says: "no answer through its Service in the 10s before the cluster settled (last at 05:01:20.000)",
	}, {
		name: "the journal reads back a wrong entry",
		stage: func(h *History) {
			h.Journals = append(h.Journals, Journal{At: at(26), VM: "ns/a", Instance: "i1", Err: "journal entry 23 holds 0, want 23"})
		},
		want: JournalLoss, says: "journal entry 23 holds 0",
	}, {
		name: "the journal on the target holds fewer entries than the source had committed",
		stage: func(h *History) {
			h.Journals = append(h.Journals, Journal{At: at(27), VM: "ns/a", Instance: "i1", Through: 20})
		},
		want: JournalLoss, says: "holds 1..20 after it had committed 1..25",
	}, {
		name: "a LiveMigrate VM is not running once the cluster settled",
		stage: func(h *History) {
			h.Settled.VMs = []VM{vm("i2", "Scheduling", "n3")}
		},
		want: NotRunning, says: "Scheduling once the cluster settled",
	}, {
		name: "a LiveMigrate VM has no instance once the cluster settled",
		stage: func(h *History) {
			h.Settled.VMs = []VM{vm("", "", "")}
		},
		want: NotRunning, says: "without an instance once the cluster settled",
	}, {
		name:  "a mark stays past its limit",
		stage: func(h *History) { holdFor(h, Hold{HoldMark, "ns/a@n1"}, 6*time.Minute) },
		want:  Stuck, says: "mark ns/a@n1 held since",
	}, {
		name:  "a migration stays unended past its limit",
		stage: func(h *History) { holdFor(h, Hold{HoldMigration, "ns/m2"}, 6*time.Minute) },
		want:  Stuck, says: "migration ns/m2 held",
	}, {
		name:  "a budget stays expanded past its limit",
		stage: func(h *History) { holdFor(h, Hold{HoldBudget, "ns/a"}, 6*time.Minute) },
		want:  Stuck, says: "budget ns/a held",
	}, {
		name:  "a target pod stays pending past its limit",
		stage: func(h *History) { holdFor(h, Hold{HoldTargetPod, "ns/a-target"}, 6*time.Minute) },
		want:  Stuck, says: "target-pod ns/a-target held",
	}, {
		name:  "a cordon the user did not make stays past its limit",
		stage: func(h *History) { holdFor(h, Hold{HoldCordon, "n2"}, 3*time.Minute) },
		want:  Stuck, says: "cordon n2 held",
	}, {
		name:  "an EvictionRequest's pod runs on with lifeboat's answer past its limit",
		stage: func(h *History) { holdFor(h, Hold{HoldEviction, "ns/eviction-a"}, 6*time.Minute) },
		want:  Stuck, says: "eviction ns/eviction-a held",
	}, {
		name: "a lost node's VM is restarted elsewhere before the node is tainted out of service",
		stage: func(h *History) {
			h.Actions = []Action{{At: at(60), Kind: "node-lost", Node: "n1"},
				{At: at(80), Kind: "node-out-of-service", Node: "n1", Fatal: true, Ends: "node-lost"}}
		},
		want: Lost, says: "instance i1 ended and i2 replaced it",
	}, {
		name: "a VM's instance is replaced with no restart asked and no fatal fault",
		stage: func(h *History) {
			h.Actions = h.Actions[:1]
		},
		want: Lost, says: "instance i1 ended and i2 replaced it",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := clean()
			tc.stage(&h)
			got := Check(h, DefaultLimits())
			if len(got) == 0 {
				t.Fatalf("no violation; want %s saying %q", tc.want, tc.says)
			}
			for _, v := range got {
				if v.Kind != tc.want || !strings.Contains(v.What, tc.says) {
					t.Errorf("violation %v; want only %s saying %q", v, tc.want, tc.says)
				}
			}
		})
	}
}

// holdFor has the clean history's snapshots show h for d, as a snapshot a minute.
func holdFor(hist *History, h Hold, d time.Duration) {
	for s := time.Duration(0); s <= d; s += time.Minute {
		hist.Snapshots = append(hist.Snapshots, Snapshot{At: at(100).Add(s), VMs: []VM{vm("i2", "Running", "n3")}, Holds: []Hold{h}})
	}
}

func TestHoldsWithinTheirLimitsPass(t *testing.T) {
	h := clean()
	holdFor(&h, Hold{HoldMark, "ns/a@n1"}, 4*time.Minute)
	// The same hold again later is a new one: the time between does not count.
	h.Snapshots = append(h.Snapshots, Snapshot{At: at(500)})
	for s := time.Duration(0); s <= 4*time.Minute; s += time.Minute {
		h.Snapshots = append(h.Snapshots, Snapshot{At: at(1000).Add(s), Holds: []Hold{{HoldMark, "ns/a@n1"}}})
	}
	if v := Check(h, DefaultLimits()); len(v) != 0 {
		t.Fatalf("holds within their limits: %v", v)
	}
}

// A lost node's VM restarted elsewhere once the node is tainted out of service is a loss the
// taint explains: the admin said the node is off.
func TestALostNodesVMRestartedAfterTheTaintIsNoViolation(t *testing.T) {
	h := clean()
	h.Actions = []Action{{At: at(60), Kind: "node-lost", Node: "n1"},
		{At: at(70), Kind: "node-out-of-service", Node: "n1", Fatal: true, Ends: "node-lost"},
		{At: at(95), Kind: "node-thaw", Node: "n1", Ends: "node-lost"}}
	if v := Check(h, DefaultLimits()); len(v) != 0 {
		t.Fatalf("a restart after the out-of-service taint is a violation: %v", v)
	}
	r := Summarise(h, DefaultLimits(), map[string]bool{"node-lost": true})
	if r.Faults["node-lost"] != 1 || len(r.Losses) != 1 || r.Losses[0].Fault == nil || r.Losses[0].Fault.Kind != "node-out-of-service" {
		t.Fatalf("faults %v, losses %+v: want one node-lost, its VM's loss blamed on the taint", r.Faults, r.Losses)
	}
}

func TestALossAfterAFatalFaultIsReportedNotAViolation(t *testing.T) {
	h := clean()
	h.Actions = []Action{{At: at(64), Kind: "node-freeze", Node: "n1", Fatal: true}}
	if v := Check(h, DefaultLimits()); len(v) != 0 {
		t.Fatalf("a loss a fatal fault explains is a violation: %v", v)
	}
	losses := Losses(h, DefaultLimits())
	if len(losses) != 1 || losses[0].Fault == nil || losses[0].Fault.Kind != "node-freeze" || losses[0].Old != "i1" || losses[0].New != "i2" {
		t.Fatalf("losses %+v: want i1 replaced by i2, blamed on the node freeze", losses)
	}
	// A fatal fault on another node explains nothing.
	h.Actions[0].Node = "n2"
	if v := Check(h, DefaultLimits()); len(v) != 1 || v[0].Kind != Lost {
		t.Fatalf("a fault on another node excused the loss: %v", v)
	}
}

func TestCountingSpans(t *testing.T) {
	for _, tc := range []struct {
		name     string
		readings []Console
		want     []span
	}{
		{"nothing counted", still("v", "i", "n", 0, 5, 3), nil},
		{"one stretch", counting("v", "i", "n", 0, 3, 1), []span{{at(0.5), at(3)}}},
		{"a pause shorter than the gap stays one stretch", join(counting("v", "i", "n", 0, 2, 1), counting("v", "i", "n", 5, 7, 4)), []span{{at(0.5), at(7)}}},
		{"a longer pause splits it", join(counting("v", "i", "n", 0, 2, 1), counting("v", "i", "n", 10, 12, 4)), []span{{at(0.5), at(2)}, {at(10.5), at(12)}}},
		{"the first counter of a console is no counting", []Console{{At: at(0)}, {At: at(1), Counter: 7}, {At: at(2), Counter: 7}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := countingSpans(tc.readings, DefaultLimits().Gap)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLongestStops(t *testing.T) {
	stops := LongestStops(clean().Consoles, time.Second)
	if len(stops) != 1 || stops[0].VM != "ns/a" {
		t.Fatalf("stops %+v: want one, of ns/a", stops)
	}
	// The first migration: 21 last seen at 20, 22 first seen at 21.5, a tick apart: half a second.
	if stops[0].Length != 500*time.Millisecond || !stops[0].Ended.Equal(at(21.5)) {
		t.Errorf("longest stop %v ending %v; want 500ms ending at 21.5 s", stops[0].Length, stops[0].Ended)
	}
}

func TestTheReportSaysWhatHappened(t *testing.T) {
	h := clean()
	h.Actions = append(h.Actions, Action{At: at(60), Kind: "qemu-kill", VM: "ns/a", Fatal: true},
		Action{At: at(62), Kind: "agent-kill", Node: "n1"}, Action{At: at(64), Kind: "agent-started", Ends: "agent-kill"},
		Action{At: at(63), Kind: "eviction-request", VM: "ns/a"})
	h.Served = true
	h.Answers = append(h.Answers, Answer{At: at(90), VM: "ns/a", Boot: "b2", Counter: 20})
	faults := map[string]bool{"agent-kill": true, "qemu-kill": true}
	r := Summarise(h, DefaultLimits(), faults)
	var b bytes.Buffer
	r.Print(&b)
	for _, want := range []string{
		"operations: eviction-request 1, restart 1",
		"faults:     agent-kill 2, qemu-kill 1",
		"migrations by outcome: Succeeded 1",
		"longest stop a guest saw: 500ms (VM ns/a, instance i1",
		"VMs lost: 0",
		"two-copy events: 0",
		"answers through Services: 4",
		"settle after the last fault (05:01:04): 1s",
		"violations: 0",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestSettlingCountsFromTheLastSettledStretch(t *testing.T) {
	h := clean()
	h.Actions = append(h.Actions, Action{At: at(64), Kind: "agent-kill", Node: "n1"})
	// Calm at 65, then a mark at 70 that the fault set off, then calm for good from 75.
	h.Snapshots = append(h.Snapshots, Snapshot{At: at(70), VMs: []VM{vm("i1", "Running", "n1")}, Holds: []Hold{{HoldMark, "ns/a@n1"}}})
	r := Summarise(h, DefaultLimits(), map[string]bool{"agent-kill": true})
	if r.Settle != 11*time.Second {
		t.Errorf("settled %s after the last fault; want 11s (from 75 s, the last stretch's start)", r.Settle)
	}
	h.Settled.Holds = []Hold{{HoldMigration, "ns/m9"}}
	if r := Summarise(h, DefaultLimits(), map[string]bool{"agent-kill": true}); r.Settle >= 0 {
		t.Errorf("settled %s, though the last snapshot holds a migration", r.Settle)
	}
}
