package agent

import (
	"fmt"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Progress is what the convergence policy observes of a running migration.
type Progress struct {
	// Remaining is the memory still to copy, in bytes.
	Remaining uint64
	// DirtyRate is how fast the guest dirties memory and Bandwidth how fast it is sent, in bytes per second.
	DirtyRate, Bandwidth uint64
	// Elapsed is the time since the transfer started; SinceEscalation since the last step up;
	// PassElapsed since the pass over memory under way began (in the first pass, Elapsed).
	Elapsed, SinceEscalation, PassElapsed time.Duration
	// TimeLeft is the time until the deadline (for node pressure, the kubelet's SIGKILL); zero or
	// negative when it has passed, and meaningless when HasDeadline is false.
	TimeLeft    time.Duration
	HasDeadline bool
	// FirstPass is true while the migration makes its first pass over memory: libvirt has not
	// measured the dirty rate yet. Total is the guest's memory, what a second pass may have to
	// copy again at worst.
	FirstPass bool
	Total     uint64
	// Pass is the pass over memory under way, from 1: Remaining is what is left of it, not
	// what the guest has rewritten since it began.
	Pass uint64
	// Estimated is true when DirtyRate is QEMU's page-sampling estimate rather than libvirt's
	// count (during the first pass). Without it, DirtyRate says nothing in the first pass.
	Estimated bool
	// Normal is the bytes of the pages sent whole, not found all zeros: in the first pass, what
	// of the memory it has seen the guest has in use.
	Normal uint64
	// Resident is the guest's QEMU process's resident memory in the first pass, zero when not
	// known: the guest can have in use no more than that (domain.JobStats.Resident).
	// MemoryRemaining is the memory part of Remaining, zero when libvirt does not say.
	Resident, MemoryRemaining uint64
}

// String says what the policy saw, for an escalation's Event and the deadline matrix: an admin
// asking why a guest was paused reads there how much was left to copy, at what rates, and how
// little time.
func (p Progress) String() string {
	const mib = 1 << 20
	dirty := fmt.Sprintf("the guest writing %d MiB/s", p.DirtyRate/mib)
	switch {
	case p.Estimated:
		dirty += " (sampled)"
	case p.FirstPass:
		dirty = "the guest's dirty rate not known yet"
	}
	left := fmt.Sprintf("%d MiB left in it", p.Remaining/mib)
	if rest := p.restInUse(); rest < p.Remaining {
		left += fmt.Sprintf(" (at most %d MiB of it in use, %d MiB resident)", rest/mib, p.Resident/mib)
	}
	return fmt.Sprintf("pass %d over memory with %s, %s, %d MiB/s sent, %s to the deadline",
		p.Pass, left, dirty, p.Bandwidth/mib, p.TimeLeft.Round(100*time.Millisecond))
}

// Allowed are the convergence modes the LifeboatConfig permits beyond pre-copy.
type Allowed struct{ AutoConverge, PostCopy, Pause bool }

// Convergence policy constants.
const (
	// convergenceWarmUp: the first pass over memory says nothing of convergence yet.
	convergenceWarmUp = 2 * time.Second
	// escalationDwell gives a step (auto-converge throttling, in particular) time to show its effect.
	escalationDwell = 3 * time.Second
	// safetyMargin is kept between the projected end and the deadline for what the projection
	// does not count: the switch-over (SwitchOver), the source's confirm phase (its QEMU stopped
	// and seen gone, about 0.2 s) and a reading up to a tick (0.5 s) late: 1 s in all. It was 5 s
	// while the matrix's daemons had no subreaper and the confirm phase there took 1.1 to 2 s
	// (docs/benchmarks.md), then a fixed 3 s.
	safetyMargin = SwitchOver + 800*time.Millisecond
	// marginShare: a further share of the time left is kept for the projection's own error. Its
	// rates are measured over the last seconds, and what a change in them costs grows with how
	// far the projection looks: a fixed 3 s paused guests whose pre-copy would have ended 2 s
	// before the deadline (the matrix's 1 GiB at half the cap with 30 s, 256 MiB at ¾ with 15 s),
	// where the projection had been right to within 0.2 s.
	marginShare = 8
)

// NextMode is the deadline-aware convergence policy: it escalates pre-copy → auto-converge →
// post-copy (or, where post-copy is not allowed, pause) when the migration, at its current
// pace, would not end before the deadline minus a safety margin. It never steps down, jumps
// to the last resort when even a full-speed copy of what remains would barely fit, and places
// a pause where it stops the guest least in time (PlacePause).
func NextMode(current v1alpha1.MigrationMode, p Progress, allowed Allowed) v1alpha1.MigrationMode {
	if current == "" {
		current = v1alpha1.MigrationModePreCopy
	}
	// Without transfer figures yet (the job is still connecting) there is nothing to project.
	if !p.HasDeadline || p.Elapsed < convergenceWarmUp || p.Bandwidth == 0 || isFinal(current) {
		return current
	}
	budget := timeBudget(p.TimeLeft)
	last := lastResort(allowed)
	// A blind first pass: libvirt's dirty rate shows only once it ends, and for a large guest
	// with a near deadline that is too late to act on. When the rest of this pass and a
	// worst-case second one would not fit, take the last resort now: a hard deadline (the
	// kubelet's SIGKILL) is worth more than a short pause.
	if p.FirstPass && !p.Estimated && last != "" && copyTime(p.Remaining+p.Total, p.Bandwidth) > budget {
		return last
	}
	low := p.DirtyRate
	if p.Estimated {
		// A sampled estimate scatters: project with a margin. One-second samples of 16384
		// pages per GiB stay within an eighth of the rate a guest is told to write
		// (domain.TestDirtyRateEstimateMatchesTheGuest).
		margin := p.DirtyRate / 8
		low = p.DirtyRate - margin
		p.DirtyRate += margin
	}
	finish, converging := projectedFinish(p)
	if converging && finish <= budget {
		return current
	}
	placement := PauseReady
	switch last {
	case v1alpha1.MigrationModePostCopy:
		// Post-copy costs the guest little whenever it comes: take it as soon as copying at full
		// speed what a stop would leave to send no longer fits comfortably.
		if copyTime(p.owed(), p.Bandwidth) >= budget/2 {
			return last
		}
	case v1alpha1.MigrationModePaused:
		// A pause stops the guest for the whole copy of what it leaves to send: it comes where
		// that is least and still in time (the matrix's 1 GiB guest at half the cap, 30 s
		// grace, was paused 13 s at the first look when pausing at budget/2).
		if placement = PlacePause(p.pauseTiming(budget, low)); placement == PauseNow {
			return last
		}
	}
	if p.SinceEscalation < escalationDwell && current != v1alpha1.MigrationModePreCopy {
		return current
	}
	switch {
	case current == v1alpha1.MigrationModePreCopy && allowed.AutoConverge:
		return v1alpha1.MigrationModeAutoConverge
	case last == v1alpha1.MigrationModePaused && placement == PauseWait:
		return current
	case last != "":
		return last
	}
	return current
}

// timeBudget is how long the migration may still take: the time left less the margins.
func timeBudget(timeLeft time.Duration) time.Duration {
	return timeLeft - safetyMargin - timeLeft/marginShare
}

// toPassEnd is how long the pass under way still takes at full speed, and what the guest will
// have rewritten during the whole pass by then: what the next pass sends.
func (p Progress) toPassEnd() (time.Duration, uint64) {
	rest := copyTime(p.restInUse(), p.Bandwidth)
	return rest, p.rewritten(p.PassElapsed + rest)
}

// owed is what stopping the guest now would leave to send, by which post-copy is timed. From
// the second pass on, that is what is left of the pass and what the guest rewrote since it
// began (libvirt sends every page written since its last look at the dirty log, and looks at
// each pass's start). In the first pass it is what is left of the pass alone: the pass's end,
// where what the guest rewrote is all that is left, comes before its rewrites would count.
func (p Progress) owed() uint64 {
	if p.FirstPass {
		return p.restInUse()
	}
	return p.capped(p.Remaining + p.rewritten(p.PassElapsed))
}

// restInUse is what the rest of the pass sends whole: in the first pass, of its memory at most
// what the guest has resident beyond the pages the pass sent whole, each of them resident and
// seen once (the pages it finds all zeros go as a few bytes each), and all of what is left of
// the disks. The matrix's 1 GiB guest rewriting 256 MiB at half the cap, its empty pages at the
// end, was paused 3.9 to 5.4 s in its first pass with 15 s when the whole rest was counted in
// use; with this bound it ends without a pause. Resident memory no more than what the pass sent
// whole is no bound: the rest is then counted in use.
func (p Progress) restInUse() uint64 {
	return p.memoryRestInUse() + p.Remaining - p.memoryRemaining()
}

// memoryRestInUse is restInUse without the disks.
func (p Progress) memoryRestInUse() uint64 {
	memory := p.memoryRemaining()
	if !p.FirstPass || p.Resident <= p.Normal {
		return memory
	}
	return min(memory, p.Resident-p.Normal)
}

// memoryRemaining is the memory part of Remaining: all of it where libvirt did not say.
func (p Progress) memoryRemaining() uint64 {
	if p.MemoryRemaining == 0 || p.MemoryRemaining > p.Remaining {
		return p.Remaining
	}
	return p.MemoryRemaining
}

// rewritten is what the guest writes in d at its dirty rate, at most all its memory.
func (p Progress) rewritten(d time.Duration) uint64 {
	return rewrittenIn(p.DirtyRate, d, p.Total)
}

// capped is n, at most the guest's memory where libvirt reported it.
func (p Progress) capped(n uint64) uint64 { return capAt(n, p.Total) }

// rewrittenIn is what a guest dirtying rate bytes a second writes in d, at most limit.
func rewrittenIn(rate uint64, d time.Duration, limit uint64) uint64 {
	return capAt(uint64(float64(rate)*d.Seconds()), limit)
}

// capAt is n, at most limit where one is known (above 0).
func capAt(n, limit uint64) uint64 {
	if limit > 0 {
		return min(n, limit)
	}
	return n
}

func isFinal(m v1alpha1.MigrationMode) bool {
	return m == v1alpha1.MigrationModePostCopy || m == v1alpha1.MigrationModePaused
}

func lastResort(a Allowed) v1alpha1.MigrationMode {
	switch {
	case a.PostCopy:
		return v1alpha1.MigrationModePostCopy
	case a.Pause:
		return v1alpha1.MigrationModePaused
	}
	return ""
}

// projectedFinish is how long pre-copy still needs at the current rates; not converging when
// the guest dirties memory as fast as it is sent. The pass under way sends what is left of it
// at full speed whatever the guest writes; what the guest wrote during the whole pass (at most
// all its memory) then shrinks geometrically, by DirtyRate/Bandwidth a pass: the sum is
// rewritten/(Bandwidth-DirtyRate). Remaining/(Bandwidth-DirtyRate) alone, the same at a pass's
// start, would forget the pass's rewrites as it ends.
func projectedFinish(p Progress) (time.Duration, bool) {
	if p.Bandwidth <= p.DirtyRate {
		return 0, false
	}
	rest, next := p.toPassEnd()
	return rest + copyTime(next, p.Bandwidth-p.DirtyRate), true
}

func copyTime(bytes, rate uint64) time.Duration {
	if rate == 0 {
		return time.Duration(1<<62 - 1)
	}
	return time.Duration(float64(bytes) / float64(rate) * float64(time.Second))
}
