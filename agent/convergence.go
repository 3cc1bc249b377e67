package agent

import (
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Progress is what the convergence policy observes of a running migration.
type Progress struct {
	// Remaining is the memory still to copy, in bytes.
	Remaining uint64
	// DirtyRate is how fast the guest dirties memory and Bandwidth how fast it is sent, in bytes per second.
	DirtyRate, Bandwidth uint64
	// Elapsed is the time since the transfer started; SinceEscalation since the last step up.
	Elapsed, SinceEscalation time.Duration
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
}

// Allowed are the convergence modes the LifeboatConfig permits beyond pre-copy.
type Allowed struct{ AutoConverge, PostCopy, Pause bool }

// Convergence policy constants.
const (
	// convergenceWarmUp: the first pass over memory says nothing of convergence yet.
	convergenceWarmUp = 2 * time.Second
	// escalationDwell gives a step (auto-converge throttling, in particular) time to show its effect.
	escalationDwell = 3 * time.Second
	// safetyMargin is kept between the projected end and the deadline: the switch-over and the
	// source launcher's exit must also fit before the kubelet's SIGKILL.
	safetyMargin = 5 * time.Second
)

// NextMode is the deadline-aware convergence policy: it escalates pre-copy → auto-converge →
// post-copy (or, where post-copy is not allowed, pause) when the migration, at its current
// pace, would not end before the deadline minus a safety margin. It never steps down, and
// jumps to the last resort when even a full-speed copy of what remains would barely fit.
func NextMode(current v1alpha1.MigrationMode, p Progress, allowed Allowed) v1alpha1.MigrationMode {
	if current == "" {
		current = v1alpha1.MigrationModePreCopy
	}
	// Without transfer figures yet (the job is still connecting) there is nothing to project.
	if !p.HasDeadline || p.Elapsed < convergenceWarmUp || p.Bandwidth == 0 || isFinal(current) {
		return current
	}
	budget := p.TimeLeft - safetyMargin
	last := lastResort(allowed)
	// A blind first pass: libvirt's dirty rate shows only once it ends, and for a large guest
	// with a near deadline that is too late to act on. When the rest of this pass and a
	// worst-case second one would not fit, take the last resort now: a hard deadline (the
	// kubelet's SIGKILL) is worth more than a short pause.
	if p.FirstPass && !p.Estimated && last != "" && copyTime(p.Remaining+p.Total, p.Bandwidth) > budget {
		return last
	}
	if p.Estimated {
		// A sampled estimate scatters (1 s samples of a 256 MiB guest rewriting 16 MiB/s read
		// 8 to 24 MiB/s, domain.TestDirtyRateEstimateMatchesTheGuest): project with a margin.
		p.DirtyRate += p.DirtyRate / 4
	}
	finish, converging := projectedFinish(p)
	if converging && finish <= budget {
		return current
	}
	// Copying what remains at full speed, with the guest stopped from dirtying it, is what the
	// last resort costs. Post-copy costs the guest little whenever it comes: take it as soon as
	// that copy no longer fits comfortably. A pause stops the guest for the whole copy: take it
	// only when waiting one more step could no longer fit it, so that auto-converge first
	// shrinks what remains (the matrix's 1 GiB guest at half the cap, 30 s grace, was paused
	// 13 s at the first look when pausing at budget/2).
	takeLastAt := budget / 2
	if last == v1alpha1.MigrationModePaused {
		takeLastAt = budget - escalationDwell
	}
	if last != "" && copyTime(p.Remaining, p.Bandwidth) >= takeLastAt {
		return last
	}
	if p.SinceEscalation < escalationDwell && current != v1alpha1.MigrationModePreCopy {
		return current
	}
	switch {
	case current == v1alpha1.MigrationModePreCopy && allowed.AutoConverge:
		return v1alpha1.MigrationModeAutoConverge
	case last == v1alpha1.MigrationModePaused && converging:
		// What remains shrinks, so the later the pause the shorter: it comes when due (above).
		return current
	case last != "":
		return last
	}
	return current
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

// projectedFinish is how long pre-copy still needs at the current rates (the passes shrink
// geometrically, by DirtyRate/Bandwidth each: the sum is Remaining/(Bandwidth-DirtyRate));
// not converging when the guest dirties memory as fast as it is sent.
func projectedFinish(p Progress) (time.Duration, bool) {
	if p.Bandwidth <= p.DirtyRate {
		return 0, false
	}
	if !p.FirstPass {
		return copyTime(p.Remaining, p.Bandwidth-p.DirtyRate), true
	}
	// The first pass sends what remains of it at full speed whatever the guest writes; what
	// the guest wrote during the whole pass (at most all its memory) then shrinks geometrically.
	rest := copyTime(p.Remaining, p.Bandwidth)
	rewritten := min(p.Total, uint64(float64(p.DirtyRate)*(p.Elapsed+rest).Seconds()))
	return rest + copyTime(rewritten, p.Bandwidth-p.DirtyRate), true
}

func copyTime(bytes, rate uint64) time.Duration {
	if rate == 0 {
		return time.Duration(1<<62 - 1)
	}
	return time.Duration(float64(bytes) / float64(rate) * float64(time.Second))
}
