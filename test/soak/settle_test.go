package soak

import (
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/soak/check"
)

// end is the plan's end in these tests.
var end = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

func at(seconds float64) time.Time { return end.Add(time.Duration(seconds * float64(time.Second))) }

// vmShown is ns/a as the API shows it: instance in phase.
func vmShown(instance, phase string) check.VM {
	return check.VM{Name: "ns/a", Instance: instance, Phase: phase, Node: "n1", LiveMigrate: true, WantRunning: true}
}

// seenAt is the guest of ns/a last counting on instance's console at counted and answering at answered.
func seenAt(instance string, counted, answered time.Time) Seen {
	return Seen{VMs: []string{"ns/a"}, Counting: map[string]Counted{"ns/a": {Instance: instance, At: counted}},
		Answered: map[string]time.Time{"ns/a": answered}}
}

func TestSettled(t *testing.T) {
	now := at(20)
	for _, tc := range []struct {
		name    string
		last    check.Snapshot
		seen    Seen
		settled bool
	}{
		{"running, counting and answering", check.Snapshot{At: at(19), VMs: []check.VM{vmShown("new", "Running")}},
			seenAt("new", at(19.5), at(19.5)), true},
		// The soak's defect (seed 21): a VM restarted just before the plan's end; the API shows
		// its new instance Running while only the old instance's console has counted yet.
		{"the API shows the new instance, only the old one's console counts", check.Snapshot{At: at(19), VMs: []check.VM{vmShown("new", "Running")}},
			seenAt("old", at(19.5), at(19.5)), false},
		{"a snapshot from before the plan's end", check.Snapshot{At: at(-1), VMs: []check.VM{vmShown("new", "Running")}},
			seenAt("new", at(19.5), at(19.5)), false},
		{"a migration held", check.Snapshot{At: at(19), VMs: []check.VM{vmShown("new", "Running")}, Holds: []check.Hold{{Kind: check.HoldMigration, Name: "ns/m"}}},
			seenAt("new", at(19.5), at(19.5)), false},
		{"not Running", check.Snapshot{At: at(19), VMs: []check.VM{vmShown("new", "Scheduling")}},
			seenAt("new", at(19.5), at(19.5)), false},
		{"stopped counting", check.Snapshot{At: at(19), VMs: []check.VM{vmShown("new", "Running")}},
			seenAt("new", at(14), at(19.5)), false},
		{"stopped answering", check.Snapshot{At: at(19), VMs: []check.VM{vmShown("new", "Running")}},
			seenAt("new", at(19.5), at(14)), false},
		{"a halted VM need not run", check.Snapshot{At: at(19), VMs: []check.VM{{Name: "ns/b", LiveMigrate: true}, vmShown("new", "Running")}},
			seenAt("new", at(19.5), at(19.5)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Settled(tc.last, tc.seen, end, now); got != tc.settled {
				t.Errorf("Settled = %t, want %t", got, tc.settled)
			}
		})
	}
}

func TestCalm(t *testing.T) {
	type look struct {
		at      float64 // seconds after the plan's end
		settled bool
		calm    bool
	}
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		// The soak's defect (seed 21): a VM restarted 0.1 s before the plan's end; its VMI,
		// being deleted, still shows Running at the first look, settled, and the restart shows
		// at the next.
		{"a VMI being deleted looks settled for a moment", []look{
			{0, true, false}, {2, false, false}, {4, false, false}, {6, true, false}, {8, true, false},
			{14, true, false}, {16, true, true}}},
		{"settled from the first look", []look{{0, true, false}, {2, true, false}, {8, true, false}, {10, true, true}, {12, true, true}}},
		{"a break starts the window again", []look{{0, true, false}, {9.9, true, false}, {10, false, false}, {12, true, false}, {21.9, true, false}, {22, true, true}}},
		{"never settled", []look{{0, false, false}, {20, false, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Calm{Window: 10 * time.Second}
			for _, l := range tc.looks {
				if got := c.Look(at(l.at), l.settled); got != l.calm {
					t.Errorf("the look %.1f s after the plan's end (settled: %t): calm %t, want %t", l.at, l.settled, got, l.calm)
				}
			}
		})
	}
}

// TestSettledAfterRestart replays the soak's defect (seed 21), both halves, look by look every
// 2 s as the soak looks: VM ns/a restarted 0.1 s before the plan's end. Its old VMI, being
// deleted, still shows Running with its guest counting; then the API shows no instance; then the
// new one Running while only the old instance's console has counted; then the new guest counts.
// Settled only once the new guest has counted and answered for the calm window.
func TestSettledAfterRestart(t *testing.T) {
	type look struct {
		at            float64 // seconds after the plan's end
		shown         check.VM
		counting      string  // the instance whose counter rose last
		counted       float64 // when
		answered      float64
		settled, calm bool
	}
	looks := []look{
		{0.5, vmShown("old", "Running"), "old", 0.4, 0.3, true, false},
		{2.5, check.VM{Name: "ns/a", LiveMigrate: true, WantRunning: true}, "old", 0.4, 0.3, false, false},
		{4.5, vmShown("new", "Scheduling"), "old", 0.4, 0.3, false, false},
		// The old console still counted within Recent when the new instance showed Running.
		{6.5, vmShown("new", "Running"), "old", 2.4, 5.0, false, false},
		{8.5, vmShown("new", "Running"), "new", 8.4, 8.2, true, false},
		{10.5, vmShown("new", "Running"), "new", 10.4, 10.2, true, false},
		{16.5, vmShown("new", "Running"), "new", 16.4, 16.2, true, false},
		{18.5, vmShown("new", "Running"), "new", 18.4, 18.2, true, true},
	}
	c := Calm{Window: 10 * time.Second}
	for _, l := range looks {
		last := check.Snapshot{At: at(l.at - 0.1), VMs: []check.VM{l.shown}}
		settled := Settled(last, seenAt(l.counting, at(l.counted), at(l.answered)), end, at(l.at))
		calm := c.Look(at(l.at), settled)
		if settled != l.settled || calm != l.calm {
			t.Errorf("the look %.1f s after the plan's end (the API shows %q %s, %q counts): settled %t, calm %t; want %t, %t",
				l.at, l.shown.Instance, l.shown.Phase, l.counting, settled, calm, l.settled, l.calm)
		}
	}
}
