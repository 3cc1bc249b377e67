package agent

import (
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestPlacePause(t *testing.T) {
	const mib = 1 << 20
	// The guest of the case that asked for this rule: 256 MiB, the demo's 32 MiB/s cap, rewriting
	// 160 MiB at 1½ the cap (54 MiB/s with the sample's margin), 2 s into its first pass with
	// 179 MiB of it left, 150 MiB of them in use: 180 MiB in use in all. The rest of the pass
	// takes 4.7 s, and its rewrites (all 180 MiB at most) 5.6 s stopped: 10.3 s.
	demo := PauseTiming{Budget: 11*time.Second + SwitchOver, Pass: 1, PassElapsed: 2 * time.Second, Remaining: 179 * mib, ToSend: 150 * mib,
		DirtyRate: 54 * mib, Bandwidth: 32 * mib, WorkingSet: 180 * mib, Total: 256 * mib, SwitchOver: SwitchOver}
	// How much it has in use not known: at worst all its memory is rewritten, 8 s stopped.
	demoUnknown := demo
	demoUnknown.ToSend, demoUnknown.WorkingSet = demoUnknown.Remaining, demoUnknown.Total
	demoUnknownEarlier := demoUnknown
	demoUnknownEarlier.Budget = 12*time.Second + SwitchOver
	demoLate := demo
	demoLate.Budget = 10*time.Second + SwitchOver
	// The same guest a tick into its second pass: what it rewrote during the first (160 MiB) is
	// left, and it rewrites faster than it is sent.
	secondPass := PauseTiming{Budget: 9*time.Second + SwitchOver, Pass: 2, PassElapsed: 500 * time.Millisecond, Remaining: 160 * mib, ToSend: 160 * mib,
		DirtyRate: 48 * mib, Bandwidth: 32 * mib, WorkingSet: 256 * mib, Total: 256 * mib, SwitchOver: SwitchOver}
	secondPassLate := secondPass
	secondPassLate.Budget = 7*time.Second + SwitchOver
	// The matrix's 1 GiB guest at half the cap, auto-converged, at its third pass's start: 255 MiB
	// to go, 4.5 s of budget; with 8 s, the pass after it still fits a pause.
	converging := PauseTiming{Budget: 4500*time.Millisecond + SwitchOver, Pass: 3, Remaining: 255 * mib, ToSend: 255 * mib,
		DirtyRate: 32 * mib, Bandwidth: 64 * mib, WorkingSet: 1024 * mib, Total: 1024 * mib, SwitchOver: SwitchOver}
	convergingEarly := converging
	convergingEarly.Budget = 8*time.Second + SwitchOver
	// A guest writing a quarter of the cap in its first pass: what it rewrites is little.
	slowWriter := PauseTiming{Budget: 8*time.Second + SwitchOver, Pass: 1, PassElapsed: 2 * time.Second, Remaining: 300 * mib, ToSend: 300 * mib,
		DirtyRate: 16 * mib, Bandwidth: 64 * mib, WorkingSet: 1024 * mib, Total: 1024 * mib, SwitchOver: SwitchOver}
	for _, tc := range []struct {
		name string
		t    PauseTiming
		want PausePlacement
	}{
		{"first pass far from done, time to finish it and send its rewrites: wait", demo, PauseWait},
		{"first pass, its end and rewrites do not fit, a pause of all memory due: now", demoLate, PauseNow},
		{"first pass, the memory in use unknown: all of it is what the pass's end may leave; a pause of it due: now", demoUnknown, PauseNow},
		{"first pass, its end does not fit but a pause of all memory still does after one more step: wait", demoUnknownEarlier, PauseWait},
		{"first pass of a guest writing slowly: its end leaves little, wait", slowWriter, PauseWait},
		{"first pass done, the guest rewriting faster than it is sent: no later pause is shorter", secondPass, PauseReady},
		{"first pass done, rewriting faster than sent, one more step would not fit: now", secondPassLate, PauseNow},
		{"converging, a pause at the next pass's start would not fit: now", converging, PauseNow},
		{"converging, a pause at the next pass's start still fits: wait", convergingEarly, PauseWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PlacePause(tc.t); got != tc.want {
				t.Errorf("PlacePause = %s, want %s", got, tc.want)
			}
		})
	}
}

// What the first pass has seen of the guest's memory tells how much of the rest it must send
// whole and how much the guest can have rewritten at its end.
func TestPauseTimingFromTheFirstPass(t *testing.T) {
	const mib = 1 << 20
	p := Progress{FirstPass: true, Pass: 1, Remaining: 800 * mib, Total: 1024 * mib, Normal: 70 * mib, Zero: 154 * mib}
	got := p.pauseTiming(10 * time.Second)
	if got.ToSend != 250*mib || got.WorkingSet != 320*mib {
		t.Errorf("from 70 MiB in use of 224 seen, 800 MiB left: %d MiB to send and %d MiB in use, want 250 and 320", got.ToSend/mib, got.WorkingSet/mib)
	}
	p.FirstPass, p.Pass = false, 2
	if got := p.pauseTiming(10 * time.Second); got.ToSend != 800*mib || got.WorkingSet != 1024*mib {
		t.Errorf("second pass: %d MiB to send and %d MiB rewritable, want what is left and all the memory", got.ToSend/mib, got.WorkingSet/mib)
	}
}

// The policy lets a guest whose first pass shows a small working set finish that pass running,
// where it would have paused it with most of its memory left.
func TestNextModeWaitsForTheFirstPassEnd(t *testing.T) {
	const mib = 1 << 20
	noPostCopy := Allowed{AutoConverge: true, Pause: true}
	// The matrix's 1 GiB guest rewriting 256 MiB at 1½ the cap (96 MiB/s sampled), 15 s grace,
	// 2 s into its first pass: 800 MiB of it left, 70 of the 224 MiB seen in use. The rest of
	// the pass (250 MiB to send whole) and the rewrites (320 MiB at most) take 8.9 s of 10.4.
	p := Progress{Remaining: 800 * mib, Total: 1024 * mib, DirtyRate: 96 * mib, Estimated: true, Bandwidth: 64 * mib, FirstPass: true, Pass: 1,
		Elapsed: 2 * time.Second, PassElapsed: 2 * time.Second, SinceEscalation: 5 * time.Second, TimeLeft: leaving(10375 * time.Millisecond), HasDeadline: true,
		Normal: 70 * mib, Zero: 154 * mib}
	blindToZeros := p
	blindToZeros.Normal, blindToZeros.Zero = 0, 0
	for _, tc := range []struct {
		name    string
		current v1alpha1.MigrationMode
		p       Progress
		want    v1alpha1.MigrationMode
	}{
		{"in use known: the first pass's end waited for, auto-converge meanwhile", v1alpha1.MigrationModePreCopy, p, v1alpha1.MigrationModeAutoConverge},
		{"in use known, auto-converging: still waiting", v1alpha1.MigrationModeAutoConverge, p, v1alpha1.MigrationModeAutoConverge},
		{"in use not known: all memory may be rewritten, the pause now as before", v1alpha1.MigrationModeAutoConverge, blindToZeros, v1alpha1.MigrationModePaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextMode(tc.current, tc.p, noPostCopy); got != tc.want {
				t.Errorf("NextMode = %s, want %s", got, tc.want)
			}
		})
	}
}
