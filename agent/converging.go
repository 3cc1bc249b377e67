package agent

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// ConvergingMigration is one live migration as the source agent runs it: started with
// Options, then steered by NextMode from the job's statistics until it ends. It is the seam
// between the convergence loop and its side effects, so that benchmarks drive the agent's own
// loop against real libvirt without a cluster.
type ConvergingMigration struct {
	Migrator Migrator
	Domain   string
	Options  domain.MigrateOptions
	Allowed  Allowed
	// Deadline is when the migration must have ended; zero when it has none.
	Deadline time.Time
	// Tightened, when set, is asked on every tick for a deadline learned since the start (the
	// source pod got a SIGTERM during a drain's migration); zero for none. The earlier one holds.
	Tightened func() time.Time
	Clock     clock.WithTicker
	Log       *slog.Logger
	// Cancelled, when set, is asked on every tick while the migration can still be aborted;
	// true aborts it (the guest stays on the source).
	Cancelled func() bool
	// Escalated, when set, is told of every step up once it has taken effect, with the
	// progress that decided it.
	Escalated func(v1alpha1.MigrationMode, Progress)
	// Progressed, when set, is given every statistics read of the running job.
	Progressed func(domain.JobStats)
	// Sampled, when set, is told once what became of QEMU's sample of the guest's dirty rate,
	// with the rate where it was measured.
	Sampled func(SampleResult, uint64)
	// ResidentBounds says the guest's resident memory bounds what it has in use in the first
	// pass (Progress.Resident): true only where the node has no swap, which would hold guest
	// memory outside it.
	ResidentBounds bool
	// GuestRAM, when set, is asked with ResidentBounds on every reading in the first pass for
	// how much of the guest's RAM (of size bytes) is resident, as its launcher reads it (ok
	// false without an answer). It bounds what the guest has in use more tightly than its QEMU
	// process's resident memory, which counts QEMU's own besides (guestRAMBound).
	GuestRAM func() (resident, size uint64, ok bool)
}

// SampleResult is what became of the dirty-rate sample taken as a migration began.
type SampleResult string

const (
	// SampleMeasured: QEMU's estimate was read during the first pass over memory.
	SampleMeasured SampleResult = "measured"
	// SampleUnavailable: QEMU could not measure, or its result could not be read: the first
	// pass was judged blind.
	SampleUnavailable SampleResult = "unavailable"
	// SampleLate: the first pass ended before the sample did, so nothing needed it.
	SampleLate SampleResult = "late"
)

// MigrateConverging runs c's migration to its end and returns the last mode it used and
// Migrate's result.
func MigrateConverging(ctx context.Context, c ConvergingMigration) (v1alpha1.MigrationMode, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// QEMU's page sampling tells the guest's dirty rate during the first pass, where libvirt's
	// figure is not there yet. It must start before the migration does (libvirt holds the call
	// while a migration runs); its result is read during it.
	st := &loopState{}
	if err := c.Migrator.StartDirtyRateCalc(c.Domain, dirtyRateSample, domain.DirtyRatePageSampling); err != nil {
		c.Log.Info("the guest's dirty rate cannot be estimated; the first pass is judged blind", "err", err)
		c.settle(&st.est, SampleUnavailable)
	}
	done := make(chan error, 1)
	go func() { done <- c.Migrator.Migrate(ctx, c.Domain, c.Options) }()
	mode, escalated := v1alpha1.MigrationModePreCopy, c.Clock.Now()
	ticker := c.Clock.NewTicker(progressInterval)
	defer ticker.Stop()
	cancelled := false
	for {
		select {
		case result := <-done:
			c.settle(&st.est, SampleLate)
			if result != nil && mode == v1alpha1.MigrationModePostCopy {
				result = c.resumePostCopy(ctx, result)
			}
			return mode, result
		case <-ticker.C():
		}
		if !cancelled && !isFinal(mode) && c.Cancelled != nil && c.Cancelled() {
			cancelled = true
			cancel()
		}
		if cancelled {
			continue
		}
		next, p, err := c.step(mode, c.Clock.Since(escalated), st)
		if err != nil {
			c.Log.Warn("escalating the migration", "to", next, "err", err)
			continue
		}
		if next != mode {
			c.Log.Info("migration escalated", "from", mode, "to", next, "pass", p.Pass, "remainingBytes", p.Remaining,
				"dirtyRate", p.DirtyRate, "dirtyRateEstimated", p.Estimated, "bandwidth", p.Bandwidth, "timeLeft", p.TimeLeft,
				"normalBytes", p.Normal, "residentBytes", p.Resident)
			mode, escalated = next, c.Clock.Now()
			if c.Escalated != nil {
				c.Escalated(next, p)
			}
		}
	}
}

// step reads the job's progress and applies the convergence policy's next mode. The policy's
// Elapsed counts from the first measured transfer, not from the job's start (libvirt's
// elapsed time): the destination QEMU's start-up comes first and says nothing of convergence.
func (c ConvergingMigration) step(mode v1alpha1.MigrationMode, sinceEscalation time.Duration, st *loopState) (v1alpha1.MigrationMode, Progress, error) {
	stats, err := c.Migrator.JobStats(c.Domain)
	if err != nil || stats.Type != domain.JobUnbounded {
		return mode, Progress{}, nil // not started yet, or over: nothing to steer
	}
	if c.Progressed != nil {
		c.Progressed(stats)
	}
	if stats.MemoryBandwidth > 0 && st.transferring.IsZero() {
		st.transferring = c.Clock.Now()
	}
	p := Progress{Remaining: stats.DataRemaining, DirtyRate: stats.MemoryDirtyRate, Bandwidth: st.rates.add(stats.MemoryBandwidth),
		SinceEscalation: sinceEscalation, FirstPass: stats.MemoryIteration <= 1, Pass: max(stats.MemoryIteration, 1), Total: stats.DataTotal,
		Normal: stats.MemoryNormal, MemoryRemaining: stats.MemoryRemaining}
	if c.ResidentBounds {
		p.Resident = stats.Resident
		if p.FirstPass && c.GuestRAM != nil {
			if resident, size, ok := c.GuestRAM(); ok {
				if bound, ok := guestRAMBound(resident, size, stats.MemoryTotal); ok && (p.Resident == 0 || bound < p.Resident) {
					p.Resident = bound
				}
			}
		}
	}
	if !st.transferring.IsZero() {
		p.Elapsed = c.Clock.Since(st.transferring)
	}
	// A pass is seen to begin at the first reading that names it: up to a tick late.
	if p.Pass != st.pass {
		st.pass, st.passStarted = p.Pass, c.Clock.Now()
	}
	p.PassElapsed = c.Clock.Since(st.passStarted)
	if p.FirstPass {
		p.PassElapsed = p.Elapsed
		p.DirtyRate, p.Estimated = c.estimate(&st.est)
	}
	if deadline := c.deadline(); !deadline.IsZero() {
		p.HasDeadline, p.TimeLeft = true, deadline.Sub(c.Clock.Now())
	}
	next := NextMode(mode, p, c.Allowed)
	switch {
	case next == mode:
	case next == v1alpha1.MigrationModePostCopy:
		err = c.Migrator.StartPostCopy(c.Domain)
	case next == v1alpha1.MigrationModePaused:
		err = c.Migrator.Suspend(c.Domain)
	}
	if err != nil {
		return mode, p, err
	}
	return next, p, nil
}

// deadline is the earlier of the migration's own deadline and one learned since; zero for none.
func (c ConvergingMigration) deadline() time.Time {
	d := c.Deadline
	if c.Tightened == nil {
		return d
	}
	if t := c.Tightened(); !t.IsZero() && (d.IsZero() || t.Before(d)) {
		return t
	}
	return d
}

// loopState is what the convergence loop carries from one reading of the job to the next.
type loopState struct {
	transferring time.Time // when libvirt first measured a transfer rate
	pass         uint64    // the pass over memory last seen under way, and when it was first seen
	passStarted  time.Time
	est          dirtyRateEstimate
	rates        recentRates
}

// bandwidthWindow is how many of libvirt's transfer-rate readings the policy sees at once
// (2.5 s of them): one reading can dip far below the rate (the deadline matrix saw an idle 1 GiB
// guest with a minute to spare paused on one), and a dip must not send the migration to its
// last resort; a drop that lasts is in the median within a second and a half.
const bandwidthWindow = 5

// recentRates keeps the last bandwidthWindow non-zero transfer rates.
type recentRates struct{ samples []uint64 }

// add records rate (zero, "not measured yet", is not recorded) and returns the median of the
// recent ones; zero while there is none.
func (r *recentRates) add(rate uint64) uint64 {
	if rate > 0 {
		r.samples = append(r.samples, rate)
		if len(r.samples) > bandwidthWindow {
			r.samples = r.samples[1:]
		}
	}
	if len(r.samples) == 0 {
		return 0
	}
	sorted := slices.Clone(r.samples)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// WarmDirtyRate has QEMU sample the named running domain's pages once, for a result no one
// reads: QEMU's first page-sampling estimate of a domain reads low (for a guest rewriting 48
// MiB/s, 38 to 46 MiB/s where the samples after it read 43 to 51: domain's
// TestDirtyRateEstimateMatchesTheGuest), more than NextMode's margin, and the sample
// MigrateConverging acts on would otherwise be the first of every source's QEMU. The agent
// warms each launcher's guest once, when it first sees it run.
func WarmDirtyRate(mg Migrator, name string) error {
	return mg.StartDirtyRateCalc(name, dirtyRateSample, domain.DirtyRatePageSampling)
}

// dirtyRateSample is how long QEMU's page-sampling measurement lasts: libvirt's shortest, so
// the estimate is there before the policy's warm-up ends.
const dirtyRateSample = time.Second

// dirtyRateEstimate is what the page-sampling measurement said: result is empty until known.
type dirtyRateEstimate struct {
	rate   uint64
	result SampleResult
}

// estimate returns the guest's estimated dirty rate once QEMU has measured it.
func (c ConvergingMigration) estimate(est *dirtyRateEstimate) (uint64, bool) {
	if est.result == "" {
		rate, ok, err := c.Migrator.DirtyRate(c.Domain)
		switch {
		case err != nil:
			c.Log.Info("reading the guest's dirty rate estimate; the first pass is judged blind", "err", err)
			c.settle(est, SampleUnavailable)
		case ok:
			est.rate = rate
			c.Log.Info("the guest's dirty rate estimated", "bytesPerSecond", rate)
			c.settle(est, SampleMeasured)
		}
	}
	return est.rate, est.result == SampleMeasured
}

// settle gives the sample its result, unless it has one, and tells Sampled.
func (c ConvergingMigration) settle(est *dirtyRateEstimate, r SampleResult) {
	if est.result != "" {
		return
	}
	est.result = r
	if c.Sampled != nil {
		c.Sampled(r, est.rate)
	}
}

// Resuming a post-copy migration whose connection broke: at most postCopyResumes attempts,
// postCopyResumeRetry apart (the source's QEMU notices the break a moment after libvirt, and
// libvirt refuses a resume until it has).
const (
	postCopyResumes     = 10
	postCopyResumeRetry = time.Second
)

// resumePostCopy carries on a migration that broke in post-copy. The guest then waits paused on
// both nodes, the destination lacking the pages still on the source: neither can run it, and
// only finishing the migration saves it. It returns nil once the guest runs on the destination,
// or the last error; it does nothing unless libvirt says the source waits in that state.
func (c ConvergingMigration) resumePostCopy(ctx context.Context, broke error) error {
	err := broke
	for attempt := 1; attempt <= postCopyResumes; attempt++ {
		state, reason, serr := c.Migrator.State(c.Domain)
		if serr != nil || state != domain.Paused || reason != domain.ReasonPostcopyFailed {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-c.Clock.After(postCopyResumeRetry):
		}
		c.Log.Warn("the migration broke in post-copy; resuming it", "attempt", attempt, "err", err)
		opts := c.Options
		opts.PostCopyResume = true
		if err = c.Migrator.Migrate(ctx, c.Domain, opts); err == nil {
			c.Log.Info("the post-copy migration resumed and finished", "attempts", attempt)
			return nil
		}
	}
	return err
}
