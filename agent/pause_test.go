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
	// 179 MiB of it left. All its memory may be in use: the rest of the pass takes 5.6 s, and
	// its rewrites (all 256 MiB at worst) 8 s stopped. With 14.5 s of budget both fit.
	demo := PauseTiming{Budget: 14500*time.Millisecond + SwitchOver, Pass: 1, PassElapsed: 2 * time.Second, Remaining: 179 * mib,
		DirtyRate: 54 * mib, DirtyRateLow: 42 * mib, Bandwidth: 32 * mib, WorkingSet: 256 * mib, Total: 256 * mib, SwitchOver: SwitchOver}
	// With 11 s they do not, and a pause of all its memory fills the budget but one step.
	demoLate := demo
	demoLate.Budget = 11*time.Second + SwitchOver
	// With 12 s they do not either. The guest surely writes faster than the pass sends, and has
	// not yet written all it may (108 of 256 MiB): a later pause sends more, and ends later.
	demoLater := demo
	demoLater.Budget = 12*time.Second + SwitchOver
	// The same with a sample whose low end is under the cap: the guest may yet converge, and the
	// pause waits while a pause of all its memory fits after one more step.
	demoLaterUnsure := demoLater
	demoLaterUnsure.DirtyRateLow = 30 * mib
	// 5 s into the pass, 120 MiB of it left: the guest may have written all 256 MiB already, so
	// a later pause sends less and ends no later; the pass's end (3.75 s) and its rewrites (8 s)
	// do not fit 11.5 s, a pause of all its memory fits after one more step.
	demoWritten := demo
	demoWritten.PassElapsed, demoWritten.Remaining, demoWritten.Budget = 5*time.Second, 120*mib, 11500*time.Millisecond+SwitchOver
	// The matrix's 1 GiB guest writing all its memory at 1½ the 64 MiB/s cap (96 MiB/s
	// sampled), 1 s into its first pass, 25 s of budget: the pass's end (15 s) and its rewrites
	// (16 s) do not fit, and every moment waited adds 32 MiB to the pause.
	matrixFast := PauseTiming{Budget: 25*time.Second + SwitchOver, Pass: 1, PassElapsed: time.Second, Remaining: 960 * mib,
		DirtyRate: 108 * mib, DirtyRateLow: 84 * mib, Bandwidth: 65 * mib, WorkingSet: 1024 * mib, Total: 1024 * mib, SwitchOver: SwitchOver}
	// Near the pass's end, 60 MiB of it left: a pause now sends that and the rewrites of all
	// that was sent, the pass's end (1.9 s) and its rewrites (8 s) fit 10 s of budget. Before
	// the pause was placed, it came here: all memory (8 s) no longer fitted after one more step.
	nearlyDone := demo
	nearlyDone.Remaining, nearlyDone.PassElapsed, nearlyDone.Budget = 60*mib, 6*time.Second, 10*time.Second+SwitchOver
	// A 1 GiB guest at the matrix's 64 MiB/s cap whose first pass found all but 30 MiB of
	// what it has seen empty: with 300 MiB left, it has at most 330 MiB in use. The pass's end
	// (4.7 s) and those rewritten (5.2 s) fit 10 s.
	mostlyEmpty := PauseTiming{Budget: 10*time.Second + SwitchOver, Pass: 1, PassElapsed: 2 * time.Second, Remaining: 300 * mib,
		DirtyRate: 108 * mib, Bandwidth: 64 * mib, WorkingSet: 330 * mib, Total: 1024 * mib, SwitchOver: SwitchOver}
	// The same guest at its second pass's first reading: what it rewrote during the first
	// (160 MiB, 5 s) is left, and libvirt counts it rewriting faster than it is sent.
	secondPass := PauseTiming{Budget: 9*time.Second + SwitchOver, Pass: 2, Remaining: 160 * mib,
		DirtyRate: 48 * mib, Bandwidth: 32 * mib, WorkingSet: 256 * mib, Total: 256 * mib, SwitchOver: SwitchOver}
	secondPassLate := secondPass
	secondPassLate.Budget = 7*time.Second + SwitchOver
	// 2.5 s into that pass, 80 MiB of it left: paused now it would send those and the 120 MiB
	// rewritten since the pass began. The pass's end (2.5 s) and a pause at the next start
	// (at most all 256 MiB, 8 s) fit 11 s, not 10.
	midPass := secondPass
	midPass.Remaining, midPass.PassElapsed, midPass.Budget = 80*mib, 2500*time.Millisecond, 11*time.Second+SwitchOver
	midPassLate := midPass
	midPassLate.Budget = 10*time.Second + SwitchOver
	// The matrix's 1 GiB guest at half the cap, auto-converged, at its third pass's start: 255 MiB
	// to go, 4.5 s of budget; with 8 s, the pass after it still fits a pause.
	converging := PauseTiming{Budget: 4500*time.Millisecond + SwitchOver, Pass: 3, Remaining: 255 * mib,
		DirtyRate: 32 * mib, Bandwidth: 64 * mib, WorkingSet: 1024 * mib, Total: 1024 * mib, SwitchOver: SwitchOver}
	convergingEarly := converging
	convergingEarly.Budget = 8*time.Second + SwitchOver
	// A guest writing a quarter of the cap in its first pass: what it rewrites is little.
	slowWriter := PauseTiming{Budget: 8*time.Second + SwitchOver, Pass: 1, PassElapsed: 2 * time.Second, Remaining: 300 * mib,
		DirtyRate: 16 * mib, Bandwidth: 64 * mib, WorkingSet: 1024 * mib, Total: 1024 * mib, SwitchOver: SwitchOver}
	for _, tc := range []struct {
		name string
		t    PauseTiming
		want PausePlacement
	}{
		{"first pass far from done, time to finish it and send its rewrites: wait", demo, PauseWait},
		{"first pass nearly done, its end and rewrites fit: wait, not a pause of all memory now", nearlyDone, PauseWait},
		{"first pass that found most memory empty, its end and the rewrites of what may be in use fit: wait", mostlyEmpty, PauseWait},
		{"not enough time for the first pass's end, a pause of all memory due: now", demoLate, PauseNow},
		{"not enough time for the first pass's end, the guest surely writing faster than it is sent: now", demoLater, PauseNow},
		{"not enough time for the first pass's end, the guest perhaps converging, a pause of all memory fits after one more step: wait", demoLaterUnsure, PauseWait},
		{"not enough time for the first pass's end, the guest may have written its whole set: a later pause is shorter, wait", demoWritten, PauseWait},
		{"a 1 GiB guest writing faster than the cap, its first pass's end and rewrites do not fit: now, at the pass's start", matrixFast, PauseNow},
		{"first pass of a guest writing slowly: its end leaves little, wait", slowWriter, PauseWait},
		{"first pass done, the guest rewriting faster than it is sent: no later pause is shorter", secondPass, PauseReady},
		{"first pass done, rewriting faster than sent, one more step would not fit: now", secondPassLate, PauseNow},
		{"rewriting faster than sent, in the middle of a pass, a pause at the next pass's start fits: wait for it", midPass, PauseWait},
		{"rewriting faster than sent, in the middle of a pass, a pause at the next pass's start would not fit: now", midPassLate, PauseNow},
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

// The pages the first pass found empty are not what the guest rewrites, nor what the guest does
// not have resident; a pause in the pass sends at worst what is resident.
func TestPauseTimingFromTheFirstPass(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name                                 string
		pass                                 uint64
		remaining, memoryRemaining           uint64
		normal, resident                     uint64
		wantWorkingSet, wantRemaining, wantT uint64
	}{
		{"70 MiB of 224 seen in use, 800 left: 870 may be rewritten", 1, 800, 0, 70, 0, 870, 800, 1024},
		{"nothing seen in use yet: all may be rewritten", 1, 800, 0, 0, 0, 1024, 800, 1024},
		{"400 resident, 70 sent whole: 330 of the pass in use, 400 at worst", 1, 800, 0, 70, 400, 400, 330, 400},
		{"500 resident, 70 sent whole", 1, 800, 0, 70, 500, 500, 430, 500},
		{"500 resident, 70 sent whole, 300 left: all of it may be in use, 500 at worst", 1, 300, 0, 70, 500, 370, 300, 500},
		{"as much resident as sent whole: no bound", 1, 800, 0, 70, 70, 870, 800, 1024},
		{"more resident than the guest's memory", 1, 800, 0, 70, 2048, 870, 800, 1024},
		{"100 of disks left beside 800 of memory: the disks' rest whole", 1, 900, 800, 70, 400, 400, 430, 400},
		{"less resident than sent whole (swapped out): no bound", 1, 800, 0, 70, 60, 870, 800, 1024},
		{"second pass: pages sent whole before may be rewritten", 2, 800, 0, 70, 400, 1024, 800, 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Progress{FirstPass: tc.pass == 1, Pass: tc.pass, Remaining: tc.remaining * mib, MemoryRemaining: tc.memoryRemaining * mib,
				Total: 1024 * mib, Normal: tc.normal * mib, Resident: tc.resident * mib}
			got := p.pauseTiming(10*time.Second, 0)
			if got.WorkingSet != tc.wantWorkingSet*mib || got.Remaining != tc.wantRemaining*mib || got.Total != tc.wantT*mib {
				t.Errorf("%d MiB may be rewritten, %d MiB of the pass left in use, %d MiB at worst; want %d, %d, %d",
					got.WorkingSet/mib, got.Remaining/mib, got.Total/mib, tc.wantWorkingSet, tc.wantRemaining, tc.wantT)
			}
		})
	}
}

// The policy lets a guest whose first pass shows little memory in use finish that pass
// running, where it would have paused it with most of its memory left.
func TestNextModeWaitsForTheFirstPassEnd(t *testing.T) {
	const mib = 1 << 20
	noPostCopy := Allowed{AutoConverge: true, Pause: true}
	// A 1 GiB guest rewriting 256 MiB at 1½ the cap (96 MiB/s sampled), 2 s into its first
	// pass, whose memory lies at its end: 300 MiB of the pass left, 30 MiB of what it has seen
	// in use. The rest of the pass and the rewrites of at most 330 MiB take 9.9 s of 10.
	p := Progress{Remaining: 300 * mib, Total: 1024 * mib, DirtyRate: 96 * mib, Estimated: true, Bandwidth: 64 * mib, FirstPass: true, Pass: 1,
		Elapsed: 2 * time.Second, PassElapsed: 2 * time.Second, SinceEscalation: 5 * time.Second, TimeLeft: leaving(10 * time.Second), HasDeadline: true,
		Normal: 30 * mib}
	inUseUnknown := p
	inUseUnknown.Normal = 0
	// The same guest at its second pass's first reading: the 256 MiB it rewrote are left, and
	// libvirt counts it rewriting faster than they are sent.
	secondPass := p
	secondPass.FirstPass, secondPass.Pass, secondPass.Estimated = false, 2, false
	secondPass.Remaining, secondPass.PassElapsed, secondPass.Elapsed = 256*mib, 0, 7*time.Second
	// The deadline matrix's 1 GiB guest rewriting 256 MiB at half the cap with 15 s, as the
	// policy read it 2.5 s into its first pass: 856 MiB of the pass left, its empty pages at the
	// end, 479 MiB resident (TCG's code cache among it), 149 MiB sent whole. Counting the rest
	// in use, it paused the guest 3.9 to 5.4 s; with the resident bound pre-copy ends in time.
	halfCap := Progress{Remaining: 856 * mib, Total: 1024 * mib, DirtyRate: 31 * mib, Estimated: true, Bandwidth: 65 * mib, FirstPass: true, Pass: 1,
		Elapsed: 2500 * time.Millisecond, PassElapsed: 2500 * time.Millisecond, SinceEscalation: 2500 * time.Millisecond,
		TimeLeft: 12500 * time.Millisecond, HasDeadline: true, Normal: 149 * mib, Resident: 479 * mib}
	halfCapNoResident := halfCap
	halfCapNoResident.Resident = 0
	for _, tc := range []struct {
		name    string
		current v1alpha1.MigrationMode
		p       Progress
		want    v1alpha1.MigrationMode
	}{
		{"in use known: the first pass's end waited for, auto-converge meanwhile", v1alpha1.MigrationModePreCopy, p, v1alpha1.MigrationModeAutoConverge},
		{"in use known, auto-converging: still waiting", v1alpha1.MigrationModeAutoConverge, p, v1alpha1.MigrationModeAutoConverge},
		{"in use not known: all memory may be rewritten, the pause now as before", v1alpha1.MigrationModeAutoConverge, inUseUnknown, v1alpha1.MigrationModePaused},
		{"first pass done, rewriting faster than sent, auto-converge had its turn: the pause now", v1alpha1.MigrationModeAutoConverge, secondPass, v1alpha1.MigrationModePaused},
		{"half the cap, 330 MiB of the pass in use at most: auto-converge, the pause waits", v1alpha1.MigrationModePreCopy, halfCap, v1alpha1.MigrationModeAutoConverge},
		{"half the cap, auto-converging: still no pause", v1alpha1.MigrationModeAutoConverge, halfCap, v1alpha1.MigrationModeAutoConverge},
		{"half the cap, nothing known resident: the rest counted in use, the pause now", v1alpha1.MigrationModeAutoConverge, halfCapNoResident, v1alpha1.MigrationModePaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextMode(tc.current, tc.p, noPostCopy); got != tc.want {
				t.Errorf("NextMode = %s, want %s", got, tc.want)
			}
		})
	}
}
