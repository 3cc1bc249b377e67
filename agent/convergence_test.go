package agent

import (
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// leaving is the time left to the deadline that leaves the migration budget, its margins
// deducted: the cases say which edge of the policy they test by budget.
func leaving(budget time.Duration) time.Duration {
	return (budget + safetyMargin) * marginShare / (marginShare - 1)
}

func TestNextMode(t *testing.T) {
	const mib = 1 << 20
	all := Allowed{AutoConverge: true, PostCopy: true, Pause: true}
	noPostCopy := Allowed{AutoConverge: true, Pause: true}
	converging := Progress{Remaining: 100 * mib, Pass: 2, DirtyRate: 10 * mib, Bandwidth: 110 * mib, Elapsed: 5 * time.Second, SinceEscalation: 5 * time.Second, TimeLeft: 60 * time.Second, HasDeadline: true}
	slow := converging
	slow.DirtyRate, slow.Bandwidth = 100*mib, 110*mib // 10s to finish beyond a 5s budget
	slow.TimeLeft = leaving(5 * time.Second)
	stuck := converging
	stuck.DirtyRate = 200 * mib
	late := stuck
	late.TimeLeft = leaving(time.Second)
	justEscalated := stuck
	justEscalated.SinceEscalation = time.Second
	warmingUp := stuck
	warmingUp.Elapsed = time.Second
	noDeadline := stuck
	noDeadline.HasDeadline = false
	// libvirt reports a job that is still connecting to the target with no figures at all.
	// A 1 GiB guest 2 s into its first pass at 64 MiB/s: 700 MiB to go, its dirty rate unknown,
	// 17 s of budget (the time left less the margin).
	blind := Progress{Remaining: 700 * mib, Total: 1024 * mib, Bandwidth: 64 * mib, FirstPass: true, Pass: 1, Elapsed: 2 * time.Second, PassElapsed: 2 * time.Second, SinceEscalation: 2 * time.Second, TimeLeft: leaving(17 * time.Second), HasDeadline: true}
	blindWithTime := blind
	blindWithTime.TimeLeft = time.Minute
	// The same guest with QEMU's page-sampling estimate of its dirty rate, with 22 s of budget
	// (the matrix's 30 s grace) or 52 s (60 s).
	idle := blind
	idle.Remaining, idle.Estimated, idle.TimeLeft = 900*mib, true, leaving(22*time.Second)
	halfCap := idle
	halfCap.DirtyRate = 32 * mib // with the margin: 576 MiB rewritten in the first pass, 21 s to send them
	// 900 MiB take 14 s at 64 MiB/s: with 17 s of budget and 3 s to the next step, a pause
	// could wait no longer.
	halfCapPauseDue := halfCap
	halfCapPauseDue.TimeLeft = leaving(17 * time.Second)
	// At the start of the second pass, auto-converging: 900 MiB to go, rewritten at 32 MiB/s,
	// sent at 64 MiB/s (28 s to converge, 22 s of budget).
	throttled := halfCap
	throttled.FirstPass, throttled.Pass, throttled.Estimated = false, 2, false
	throttled.Elapsed, throttled.PassElapsed, throttled.SinceEscalation = 10*time.Second, 0, 5*time.Second
	throttledPauseDue := throttled
	throttledPauseDue.TimeLeft = leaving(17 * time.Second)
	halfCapLong := halfCap
	halfCapLong.TimeLeft = leaving(52 * time.Second)
	overCapLong := halfCapLong
	overCapLong.DirtyRate = 96 * mib
	// The matrix's 1 GiB guest writing ¾ of the cap, sampled at 60 MiB/s as QEMU's default
	// sample read it: 67 with the margin, more than is sent. A pause of all its memory (16 s)
	// fits for a while yet; with 17 s of budget it does not after one more step.
	overCapSampled := halfCapLong
	overCapSampled.DirtyRate, overCapSampled.SinceEscalation = 60*mib, 5*time.Second
	// A guest sampled at 18 MiB/s, 20 with the margin: the pass's 14 s and its rewrites'
	// 7.4 s fit 22 s of budget (a quarter's margin would make them 8.7 s and not fit).
	sampledInTime := halfCap
	sampledInTime.DirtyRate = 18 * mib
	overCapSampledLate := overCapSampled
	overCapSampledLate.TimeLeft = leaving(17 * time.Second)
	// The deadline matrix's 1 GiB guest writing 32 MiB/s with 30 s, auto-converging, as the
	// agent read it: 4 s into its second pass with 131 MiB of it left, 5.5 s of budget. The
	// pass's rewrites (194 MiB when it ends) do not converge within it, but a pause at the next
	// pass's start fits (5.3 s, a tick's rewrites counted), so the guest runs on; at that start,
	// 255 MiB to go and 4.5 s of budget, waiting for the pass after it would not fit: the pause.
	secondPass := Progress{Remaining: 131 * mib, Total: 1024 * mib, DirtyRate: 32 * mib, Bandwidth: 64 * mib, Pass: 2,
		Elapsed: 18 * time.Second, PassElapsed: 4 * time.Second, SinceEscalation: 16 * time.Second, TimeLeft: leaving(5500 * time.Millisecond), HasDeadline: true}
	thirdPassStart := secondPass
	thirdPassStart.Remaining, thirdPassStart.Pass, thirdPassStart.PassElapsed, thirdPassStart.TimeLeft = 255*mib, 3, 0, leaving(4500*time.Millisecond)
	// The ¾-the-cap guest near a pass's end: 100 MiB left of it, but 480 MiB rewritten during
	// it. A pause now sends 580 MiB (9.1 s, the budget); waiting for the pass's end costs 10.2 s.
	rewrittenPass := Progress{Remaining: 100 * mib, Total: 1024 * mib, DirtyRate: 48 * mib, Bandwidth: 64 * mib, Pass: 3,
		Elapsed: 20 * time.Second, PassElapsed: 10 * time.Second, SinceEscalation: 10 * time.Second, TimeLeft: leaving(9 * time.Second), HasDeadline: true}
	// The matrix's two guests that a fixed 3 s margin paused, at the step as the agent read it
	// at f210e4b: pre-copy alone then ended 1.8 to 2 s before the deadline, 3.5 s after the
	// 1 GiB guest's step (as projected) and 1.2 s after the 256 MiB guest's.
	halfCapFourthPass := Progress{Remaining: 119 * mib, Total: 1024 * mib, DirtyRate: 31 * mib, Bandwidth: 65 * mib, Pass: 4,
		Elapsed: 24 * time.Second, SinceEscalation: 20 * time.Second, TimeLeft: 5500 * time.Millisecond, HasDeadline: true}
	// Had that pass begun with 4 s left (2.5 s of budget), its end and the next pass sent
	// stopped would take 2.7 s: the pause could wait no longer.
	halfCapFourthPassLate := halfCapFourthPass
	halfCapFourthPassLate.TimeLeft = 4 * time.Second
	threeQuarterSeventhPass := Progress{Remaining: 20 * mib, Total: 256 * mib, DirtyRate: 48 * mib, Bandwidth: 65 * mib, Pass: 7,
		Elapsed: 10 * time.Second, PassElapsed: 200 * time.Millisecond, SinceEscalation: 7 * time.Second, TimeLeft: 3500 * time.Millisecond, HasDeadline: true}
	// The matrix's 256 MiB guest writing 1½ the cap, at a pass's start: libvirt counts 64 MiB/s,
	// the whole working set rewritten each pass. Paused at the next pass's start, a tick late,
	// it would owe 158 MiB, 2.4 s after the pass's 2 s: with 4.2 s of budget, not waiting.
	saturated := Progress{Remaining: 128 * mib, Total: 256 * mib, DirtyRate: 64 * mib, Bandwidth: 65 * mib, Pass: 5,
		Elapsed: 8 * time.Second, SinceEscalation: 6 * time.Second, TimeLeft: leaving(4200 * time.Millisecond), HasDeadline: true}
	connecting := Progress{Elapsed: 3 * time.Second, SinceEscalation: 3 * time.Second, TimeLeft: 40 * time.Second, HasDeadline: true}
	cases := []struct {
		name    string
		current v1alpha1.MigrationMode
		p       Progress
		allowed Allowed
		want    v1alpha1.MigrationMode
	}{
		{"converging in time: stay in pre-copy", v1alpha1.MigrationModePreCopy, converging, all, v1alpha1.MigrationModePreCopy},
		{"first pass: too early to judge", v1alpha1.MigrationModePreCopy, warmingUp, all, v1alpha1.MigrationModePreCopy},
		{"no deadline: never escalate", v1alpha1.MigrationModePreCopy, noDeadline, all, v1alpha1.MigrationModePreCopy},
		{"blind first pass, no time for a second: the last resort now", v1alpha1.MigrationModePreCopy, blind, noPostCopy, v1alpha1.MigrationModePaused},
		{"blind first pass with time for a second: pre-copy goes on", v1alpha1.MigrationModePreCopy, blindWithTime, noPostCopy, v1alpha1.MigrationModePreCopy},
		{"blind first pass, nothing beyond pre-copy allowed: pre-copy goes on", v1alpha1.MigrationModePreCopy, blind, Allowed{}, v1alpha1.MigrationModePreCopy},
		{"estimated idle first pass that fits: pre-copy goes on, no pause", v1alpha1.MigrationModePreCopy, idle, noPostCopy, v1alpha1.MigrationModePreCopy},
		{"estimated first pass whose rewrites do not fit, the pause not due yet: auto-converge first", v1alpha1.MigrationModePreCopy, halfCap, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"estimated first pass whose rewrites do not fit: post-copy now", v1alpha1.MigrationModePreCopy, halfCap, all, v1alpha1.MigrationModePostCopy},
		{"what remains fills the budget but one step: the pause now", v1alpha1.MigrationModePreCopy, halfCapPauseDue, noPostCopy, v1alpha1.MigrationModePaused},
		{"auto-converging too slowly, what remains still fits with a step to spare: no pause yet", v1alpha1.MigrationModeAutoConverge, throttled, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"auto-converging too slowly, what remains fills the budget but one step: the pause now", v1alpha1.MigrationModeAutoConverge, throttledPauseDue, noPostCopy, v1alpha1.MigrationModePaused},
		{"auto-converging too slowly: post-copy", v1alpha1.MigrationModeAutoConverge, throttled, all, v1alpha1.MigrationModePostCopy},
		{"estimated first pass that fits with the sample's margin of an eighth: pre-copy goes on", v1alpha1.MigrationModePreCopy, sampledInTime, noPostCopy, v1alpha1.MigrationModePreCopy},
		{"estimated first pass whose rewrites fit a longer deadline: pre-copy goes on", v1alpha1.MigrationModePreCopy, halfCapLong, noPostCopy, v1alpha1.MigrationModePreCopy},
		{"estimated first pass that cannot converge: auto-converge before the pass ends", v1alpha1.MigrationModePreCopy, overCapLong, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"mid-pass, the pass's rewrites count: in time by what is left of the pass alone, not with them: auto-converge", v1alpha1.MigrationModePreCopy, secondPass, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"mid-pass, a pause at the next pass's start still fits: no pause yet", v1alpha1.MigrationModeAutoConverge, secondPass, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"at a pass's start, a pause at the next one would not fit: the pause now", v1alpha1.MigrationModeAutoConverge, thirdPassStart, noPostCopy, v1alpha1.MigrationModePaused},
		{"a pass nearly sent but much rewritten during it: the pause now, not at its end", v1alpha1.MigrationModeAutoConverge, rewrittenPass, noPostCopy, v1alpha1.MigrationModePaused},
		{"a pass nearly sent but much rewritten during it, post-copy allowed: post-copy at once", v1alpha1.MigrationModePreCopy, rewrittenPass, all, v1alpha1.MigrationModePostCopy},
		{"not converging by the sampled rate alone, a pause of all memory fits later: auto-converge until libvirt counts", v1alpha1.MigrationModeAutoConverge, overCapSampled, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"not converging by the sampled rate alone, a pause of all memory due: the pause now", v1alpha1.MigrationModeAutoConverge, overCapSampledLate, noPostCopy, v1alpha1.MigrationModePaused},
		{"1 GiB at half the cap, 5.5 s left, pre-copy projected to end with 2 s to spare: no pause", v1alpha1.MigrationModeAutoConverge, halfCapFourthPass, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"the same pass begun with 4 s left: the pause now", v1alpha1.MigrationModeAutoConverge, halfCapFourthPassLate, noPostCopy, v1alpha1.MigrationModePaused},
		{"256 MiB at ¾ the cap, 3.5 s left, pre-copy projected to end with 2 s to spare: no pause", v1alpha1.MigrationModeAutoConverge, threeQuarterSeventhPass, noPostCopy, v1alpha1.MigrationModeAutoConverge},
		{"a pass start, the next pass's pause owing a tick's rewrites too: the pause now", v1alpha1.MigrationModeAutoConverge, saturated, noPostCopy, v1alpha1.MigrationModePaused},
		{"no transfer figures yet: nothing to project from", v1alpha1.MigrationModePreCopy, connecting, all, v1alpha1.MigrationModePreCopy},
		{"not converging: auto-converge first", v1alpha1.MigrationModePreCopy, stuck, all, v1alpha1.MigrationModeAutoConverge},
		{"converging too slowly for the deadline: auto-converge", v1alpha1.MigrationModePreCopy, slow, all, v1alpha1.MigrationModeAutoConverge},
		{"auto-converge just started: give it time", v1alpha1.MigrationModeAutoConverge, justEscalated, all, v1alpha1.MigrationModeAutoConverge},
		{"auto-converge did not help: post-copy", v1alpha1.MigrationModeAutoConverge, stuck, all, v1alpha1.MigrationModePostCopy},
		{"auto-converge did not help, post-copy not allowed: pause", v1alpha1.MigrationModeAutoConverge, stuck, noPostCopy, v1alpha1.MigrationModePaused},
		{"auto-converge not allowed: straight to the last resort", v1alpha1.MigrationModePreCopy, stuck, Allowed{Pause: true}, v1alpha1.MigrationModePaused},
		{"the deadline is close: the last resort at once", v1alpha1.MigrationModePreCopy, late, all, v1alpha1.MigrationModePostCopy},
		{"nothing allowed: pre-copy to the end", v1alpha1.MigrationModePreCopy, stuck, Allowed{}, v1alpha1.MigrationModePreCopy},
		{"post-copy is final", v1alpha1.MigrationModePostCopy, stuck, all, v1alpha1.MigrationModePostCopy},
		{"paused is final", v1alpha1.MigrationModePaused, stuck, all, v1alpha1.MigrationModePaused},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextMode(tc.current, tc.p, tc.allowed); got != tc.want {
				t.Errorf("NextMode = %s, want %s", got, tc.want)
			}
		})
	}
}

// A deadline learned while the migration runs (a SIGTERM during a drain's migration) counts when
// it is earlier than the migration's own.
func TestTheEarlierDeadlineHolds(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 11, 25, 9, 0, s, 0, time.UTC) }
	for _, tc := range []struct {
		name               string
		own, learned, want time.Time
	}{
		{name: "none at all", want: time.Time{}},
		{name: "its own only", own: at(30), want: at(30)},
		{name: "learned, none of its own", learned: at(40), want: at(40)},
		{name: "learned, earlier", own: at(30), learned: at(20), want: at(20)},
		{name: "learned, later: its own holds", own: at(30), learned: at(50), want: at(30)},
	} {
		c := ConvergingMigration{Deadline: tc.own, Tightened: func() time.Time { return tc.learned }}
		if got := c.deadline(); !got.Equal(tc.want) {
			t.Errorf("%s: deadline %s, want %s", tc.name, got, tc.want)
		}
	}
}
