package agent

import "time"

// SwitchOver is what a pause costs the guest beyond the copy of what it leaves to send: the
// switch itself, the destination's libvirt finishing the migration and running the guest (0.2 s
// at most in the deadline matrix, where pre-copy's last copy fits QEMU's 100 ms).
const SwitchOver = 200 * time.Millisecond

// PauseTiming is what places a pause that pre-copy's deadline forces: the guest stands still for
// the copy of what it leaves to send, so the pause comes where that is least and still in time.
type PauseTiming struct {
	// Budget is how long the migration may still take, the switch-over included: the time left
	// to the deadline less the projection's margins.
	Budget time.Duration
	// Pass is the pass over memory under way, from 1, and PassElapsed how long it has run.
	Pass        uint64
	PassElapsed time.Duration
	// Remaining is what is left of the pass.
	Remaining uint64
	// DirtyRate is how fast the guest rewrites its memory and Bandwidth how fast it is sent, in
	// bytes per second; DirtyRateLow is the least the guest may be rewriting (a sampled
	// estimate less its error; DirtyRate, a projection, is the estimate with it).
	DirtyRate, DirtyRateLow, Bandwidth uint64
	// WorkingSet is the most the guest can have rewritten by a pass's end, at most its memory:
	// in the first pass, what it may have in use (all of what the pass has yet to see).
	WorkingSet uint64
	// Total is the guest's memory, or what it has resident where less: what a pause in the
	// middle of the first pass sends at worst, the rest of the pass and the guest's rewrites of
	// what the pass sent before it.
	Total uint64
	// SwitchOver is what the switch costs the stopped guest beyond the copy.
	SwitchOver time.Duration
}

// PausePlacement is PlacePause's answer.
type PausePlacement string

const (
	// PauseWait: a later pause stops the guest for less, and still ends in time.
	PauseWait PausePlacement = "wait"
	// PauseReady: no later pause is shorter (a pass's start, the guest rewriting what is sent
	// as fast as it is sent), but the deadline allows one more step first: auto-converge may yet
	// avoid it.
	PauseReady PausePlacement = "ready"
	// PauseNow: any later pause would end after the deadline.
	PauseNow PausePlacement = "now"
)

// PlacePause says whether a migration that can end in time only by pausing its guest should
// pause it now. The guest's stop has a floor: what it rewrites while a pass sends it (at most
// its working set) ÷ the bandwidth, plus the switch-over. The first pass sends all the guest's
// memory; paused in its middle, the guest stands still for the rest of it and for what it
// rewrote of the part already sent, at worst all its memory. At the pass's end, what the guest
// rewrote during it is all that is left: the pause waits for it whenever the rest of the pass,
// sent while the guest runs, and the copy of its rewrites, with the guest stopped, fit the
// budget (a 256 MiB guest rewriting 160 MiB faster than a 32 MiB/s cap, paused in its first pass
// with 179 MiB of it left, stood still for 8.2 s instead of about 5).
func PlacePause(t PauseTiming) PausePlacement {
	budget := t.Budget - t.SwitchOver
	converging := t.Bandwidth > t.DirtyRate
	if t.Pass <= 1 {
		// The pass's end is seen up to a tick late: the rewrites count that tick too.
		run := copyTime(t.Remaining, t.Bandwidth)
		if run+copyTime(t.rewritten(t.PassElapsed+run+progressInterval), t.Bandwidth) <= budget {
			return PauseWait
		}
		// The pass's end cannot be waited for. A pause in the pass sends the rest of it and every
		// page the guest wrote since the pass began (QEMU reads its dirty log at the pass's end,
		// so a page written before the pass sent it goes again), at most the working set. A
		// guest surely writing faster than the pass sends adds more to that than the pass takes
		// away until it has written its whole set: before then, no later pause is shorter or
		// over sooner, and auto-converge cannot help (QEMU throttles only at the pass's end).
		// Paused in its first pass 7.5 s in, the matrix's 1 GiB guest writing 1½ the cap with
		// 30 s stood still 17.6 s, against 13.2 s for its whole memory.
		if t.DirtyRateLow > t.Bandwidth && t.rewritten(t.PassElapsed) < t.WorkingSet {
			return PauseNow
		}
		// Otherwise the pause comes while one more step (3 s) would still leave time for it. Not
		// converging by the sampled rate, one second's before the migration began, a pause of all
		// the guest's memory is what it must leave time for: with QEMU's default sample the
		// ¾-the-cap guest of the matrix read 56 to 60 MiB/s against 65 sent, where it converges;
		// paused at once, it stood still 12.6 s with 53 s to spare.
		owed := t.Remaining
		if !converging {
			owed = max(t.Total, t.Remaining)
		}
		return nowIf(copyTime(owed, t.Bandwidth) >= budget-escalationDwell)
	}
	// From the second pass on, a pause sends what is left of the pass and what the guest rewrote
	// since the pass began (libvirt sends every page written since its last look at the dirty
	// log, and looks at each pass's start): least at a pass's start, where what is left is what
	// the guest rewrote during the pass before. Paused in the middle of a pass, the matrix's
	// 1 GiB guest rewriting 256 MiB faster than the cap stood still 5.6 s for a floor of 4.2 s.
	rest := copyTime(t.Remaining, t.Bandwidth)
	next := t.rewritten(t.PassElapsed + rest)
	// The next pass's start is seen up to a tick late: what the guest rewrites in it counts too.
	nextStartDue := rest+copyTime(t.capped(next+t.rewritten(progressInterval)), t.Bandwidth) >= budget
	if !converging {
		// The guest rewrites what is sent as fast as it is sent: no later pass's start leaves
		// less than this one's. At a pass's start (its first reading) the pause is ready; in the
		// middle of one it waits for the next start while pausing there still fits.
		switch {
		case t.PassElapsed < progressInterval/2:
			owed := t.capped(t.Remaining + t.rewritten(t.PassElapsed))
			if copyTime(owed, t.Bandwidth) >= budget-escalationDwell {
				return PauseNow
			}
			return PauseReady
		case nextStartDue:
			return PauseNow
		}
		return PauseWait
	}
	// Pre-copy converges: what is owed shrinks while it runs, and most at a pass's end. The
	// pause waits for the next pass while pausing at its start still fits: the matrix's 256 MiB
	// guest writing 1½ the cap (read as 64 MiB/s, all libvirt can count when a pass sends the
	// whole working set) then stood still 2.6 to 2.8 s for a pause projected at 2 s, and
	// returned 0.7 s before the deadline.
	return nowIf(nextStartDue)
}

func nowIf(due bool) PausePlacement {
	if due {
		return PauseNow
	}
	return PauseWait
}

// rewritten is what the guest writes in d at its dirty rate, at most its working set.
func (t PauseTiming) rewritten(d time.Duration) uint64 {
	return rewrittenIn(t.DirtyRate, d, t.WorkingSet)
}

// capped is n, at most the working set where one is known.
func (t PauseTiming) capped(n uint64) uint64 { return capAt(n, t.WorkingSet) }

// pauseTiming is what PlacePause needs of p, with budget the migration's (timeBudget) and
// dirtyRateLow the least the guest may be rewriting. In the first pass, the pages it found all
// zeros are not in use: the guest can have rewritten by the pass's end at most what it sent whole
// and what it has yet to see, unless it writes to pages the pass found empty (the second pass's
// start shows it, and a pause then comes at once if it must). Of the rest of the pass, what the
// guest has resident beyond what the pass sent whole is taken to be in use (restInUse): where the
// empty pages lie is not known before the pass reaches them, how many there are at least is. A
// pause in the pass's middle sends at worst all the guest has resident.
func (p Progress) pauseTiming(budget time.Duration, dirtyRateLow uint64) PauseTiming {
	rest := p.restInUse()
	t := PauseTiming{Budget: budget + SwitchOver, Pass: p.Pass, PassElapsed: p.PassElapsed, Remaining: rest,
		DirtyRate: p.DirtyRate, DirtyRateLow: dirtyRateLow, Bandwidth: p.Bandwidth, WorkingSet: p.Total, Total: p.Total, SwitchOver: SwitchOver}
	if !p.FirstPass {
		return t
	}
	bounded := p.Resident > p.Normal
	if bounded {
		t.Total = capAt(p.Resident, t.Total)
	}
	// What the disks have left is not guest memory the guest may rewrite.
	if inUse := p.Normal + p.memoryRestInUse(); (p.Normal > 0 || bounded) && (t.WorkingSet == 0 || inUse < t.WorkingSet) {
		t.WorkingSet = inUse
	}
	return t
}
