package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// stuckMigrator is a migration that cannot converge: it fails once the guest is paused, and
// ends once switched to post-copy.
type stuckMigrator struct {
	mu                         sync.Mutex
	suspended, postCopied      chan struct{}
	resumed, postCopyRequested bool
}

func newStuckMigrator() *stuckMigrator {
	return &stuckMigrator{suspended: make(chan struct{}), postCopied: make(chan struct{})}
}

func (s *stuckMigrator) Migrate(ctx context.Context, _ string, _ domain.MigrateOptions) error {
	select {
	case <-s.suspended:
		return errors.New("the connection to the target broke")
	case <-s.postCopied:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *stuckMigrator) JobStats(string) (domain.JobStats, error) {
	const mib = 1 << 20
	return domain.JobStats{Type: domain.JobUnbounded, DataRemaining: 1024 * mib, MemoryDirtyRate: 200 * mib, MemoryBandwidth: 100 * mib, Elapsed: 5 * time.Second}, nil
}

func (s *stuckMigrator) StartPostCopy(string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.postCopyRequested = true
	close(s.postCopied)
	return nil
}

// StartDirtyRateCalc fails as an old QEMU's would: the policy judges by libvirt's figures alone.
func (s *stuckMigrator) StartDirtyRateCalc(string, time.Duration, domain.DirtyRateMode) error {
	return errors.New("dirty rate measurement not supported")
}

func (s *stuckMigrator) DirtyRate(string) (uint64, bool, error) { return 0, false, nil }

func (s *stuckMigrator) State(string) (domain.State, domain.Reason, error) {
	return domain.Running, domain.ReasonMigrated, nil
}

// brokenPostCopyMigrator cannot converge, and its connection breaks once it is switched to
// post-copy: the guest then waits paused on the source (PostcopyFailed) until a resume. The
// first resumesFailing resumes fail too.
type brokenPostCopyMigrator struct {
	stuckMigrator
	postCopy       chan struct{}
	resumesFailing int
	resumes        int
}

func (s *brokenPostCopyMigrator) Migrate(ctx context.Context, _ string, opts domain.MigrateOptions) error {
	if opts.PostCopyResume {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.resumes++
		if s.resumes <= s.resumesFailing {
			return errors.New("the connection to the target broke again")
		}
		return nil
	}
	select {
	case <-s.postCopy:
		return errors.New("the connection to the target broke")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *brokenPostCopyMigrator) StartPostCopy(string) error {
	close(s.postCopy)
	return nil
}

func (s *brokenPostCopyMigrator) State(string) (domain.State, domain.Reason, error) {
	return domain.Paused, domain.ReasonPostcopyFailed, nil
}

// TestABrokenPostCopyIsResumed: a migration that broke in post-copy is resumed over new
// connections, and succeeds when a resume does; after postCopyResumes failed resumes it fails.
func TestABrokenPostCopyIsResumed(t *testing.T) {
	for _, tc := range []struct {
		name           string
		resumesFailing int
		wantResumes    int
		wantErr        bool
	}{
		{"the first resume finishes it", 0, 1, false},
		{"the third resume finishes it", 2, 3, false},
		{"every resume fails: the migration fails", postCopyResumes, postCopyResumes, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &brokenPostCopyMigrator{postCopy: make(chan struct{}), resumesFailing: tc.resumesFailing}
			clk := clocktesting.NewFakeClock(time.Now())
			c := ConvergingMigration{
				Migrator: fake, Domain: "ns_vm", Allowed: Allowed{PostCopy: true}, Deadline: clk.Now().Add(8 * time.Second),
				Options: domain.MigrateOptions{AllowPostCopy: true}, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			}
			got, ok := migrateStepping(context.Background(), clk, c)
			if !ok {
				t.Fatal("MigrateConverging did not return")
			}
			if got.mode != v1alpha1.MigrationModePostCopy || (got.err != nil) != tc.wantErr || fake.resumes != tc.wantResumes {
				t.Errorf("MigrateConverging() = %s, %v after %d resumes; want PostCopy, error %v, after %d", got.mode, got.err, fake.resumes, tc.wantErr, tc.wantResumes)
			}
		})
	}
}

func (s *stuckMigrator) LoadQEMUCapabilities() error { return nil }
func (s *stuckMigrator) Session() bool               { return true }

func (s *stuckMigrator) Suspend(string) error {
	close(s.suspended)
	return nil
}

func (s *stuckMigrator) Resume(string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resumed = true
	return nil
}

// TestAMigrationThatWouldMissItsDeadlineEscalates: a migration that would miss its deadline is
// switched to post-copy where it is allowed and the target launcher has a userfaultfd; otherwise
// (post-copy not allowed, or the target without the device, which an Event says) the guest is
// paused to converge, and when the migration fails anyway it runs on at the source.
func TestAMigrationThatWouldMissItsDeadlineEscalates(t *testing.T) {
	for _, tc := range []struct {
		allowPostCopy, targetPostCopy bool
		wantUnavailableEvent          bool
		wantPhase                     v1alpha1.VirtualMachineInstanceMigrationPhase
		wantMode                      v1alpha1.MigrationMode
	}{
		{false, false, false, v1alpha1.MigrationFailed, v1alpha1.MigrationModePaused},
		{false, true, false, v1alpha1.MigrationFailed, v1alpha1.MigrationModePaused},
		{true, false, true, v1alpha1.MigrationFailed, v1alpha1.MigrationModePaused},
		{true, true, false, v1alpha1.MigrationSucceeded, v1alpha1.MigrationModePostCopy},
	} {
		t.Run(fmt.Sprintf("allowPostCopy=%v,targetPostCopy=%v", tc.allowPostCopy, tc.targetPostCopy), func(t *testing.T) {
			fake := newStuckMigrator()
			recorder, mig, vmi := runStuckMigration(t, fake, tc.allowPostCopy, tc.targetPostCopy)
			events := drain(recorder)
			// The escalation's Event says what decided it: the fake's 1 GiB left in the first
			// pass, no dirty rate estimate (the fake refuses to measure), 100 MiB/s sent.
			const why = "pass 1 over memory with 1024 MiB left in it, the guest's dirty rate not known yet, 100 MiB/s sent"
			if !slices.ContainsFunc(events, func(e string) bool { return strings.Contains(e, "MigrationEscalated") && strings.Contains(e, why) }) {
				t.Errorf("events %q: want a MigrationEscalated Event saying %q", events, why)
			}
			if unavailable := slices.ContainsFunc(events, func(e string) bool { return strings.Contains(e, "PostCopyUnavailable") }); unavailable != tc.wantUnavailableEvent {
				t.Errorf("events %q: want a PostCopyUnavailable Event: %v", events, tc.wantUnavailableEvent)
			}
			if mig.Status.Phase != tc.wantPhase || mig.Status.Mode != tc.wantMode {
				t.Errorf("migration: phase %s mode %s reason %q; want %s, %s", mig.Status.Phase, mig.Status.Mode, mig.Status.FailureReason, tc.wantPhase, tc.wantMode)
			}
			if fake.postCopyRequested != (tc.wantMode == v1alpha1.MigrationModePostCopy) {
				t.Errorf("post-copy requested: %v, want %v", fake.postCopyRequested, tc.wantMode == v1alpha1.MigrationModePostCopy)
			}
			if tc.wantPhase != v1alpha1.MigrationFailed {
				return
			}
			if !fake.resumed {
				t.Error("the guest paused for the migration was not resumed after it failed")
			}
			if mig.Status.FailureReason == "" {
				t.Error("a failed migration says why: failureReason is empty")
			}
			if vmi.Status.NodeName != "source" || !vmi.Status.MigrationState.Failed {
				t.Errorf("VMI after a failed migration: node %q, migrationState %+v; want still on source, failed", vmi.Status.NodeName, vmi.Status.MigrationState)
			}
		})
	}
}

// vanishingSourceMigrator is a source launcher whose guest left by migration once paused, and
// which exited with its libvirtd before the reply to the migration call, and before its last
// report, reached the agent (a make test run that lost a VM): the call fails with the
// connection's end and the launcher's libvirt answers no more.
type vanishingSourceMigrator struct{ *stuckMigrator }

func (s vanishingSourceMigrator) Migrate(ctx context.Context, _ string, _ domain.MigrateOptions) error {
	select {
	case <-s.suspended:
		return errors.New("virError(Code=38, Domain=7, Message='End of file while reading data: Input/output error')")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s vanishingSourceMigrator) State(string) (domain.State, domain.Reason, error) {
	select {
	case <-s.suspended:
		return domain.NoState, domain.ReasonUnknown, errors.New("End of file while reading data: Input/output error")
	default:
		return domain.Running, domain.ReasonUnknown, nil
	}
}

// TestAMigrationWhoseSourceVanishedIsDecidedByTheTarget: the source launcher exited as its
// guest left, taking the reply to the migration call and its last report with it. Where the
// target agent recorded the guest running there, the migration succeeded and the VM is on the
// target; where nobody said where the guest is, the migration failed without claiming that
// the guest runs on the source, and nothing tries to resume it there.
func TestAMigrationWhoseSourceVanishedIsDecidedByTheTarget(t *testing.T) {
	t.Run("the target runs the guest", func(t *testing.T) {
		fake := vanishingSourceMigrator{newStuckMigrator()}
		recorder, mig, vmi := runStuckMigration(t, fake, false, false, func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.MigrationState.TargetNode = "target"
			v.Status.MigrationState.TargetNodeDomainReadyTimestamp = ptr.To(metav1.Now())
		})
		if mig.Status.Phase != v1alpha1.MigrationSucceeded {
			t.Errorf("migration: phase %s, reason %q; want Succeeded: the target runs the guest", mig.Status.Phase, mig.Status.FailureReason)
		}
		if s := vmi.Status.MigrationState; vmi.Status.NodeName != "target" || s == nil || !s.Completed {
			t.Errorf("VMI: node %q, migrationState %+v; want on the target, completed", vmi.Status.NodeName, s)
		}
		if fake.resumed {
			t.Error("a guest that left was resumed on the source")
		}
		drain(recorder)
	})
	t.Run("nobody says where the guest is", func(t *testing.T) {
		fake := vanishingSourceMigrator{newStuckMigrator()}
		recorder, mig, vmi := runStuckMigration(t, fake, false, false)
		if mig.Status.Phase != v1alpha1.MigrationFailed {
			t.Errorf("migration: phase %s; want Failed", mig.Status.Phase)
		}
		if vmi.Status.NodeName != "source" || !vmi.Status.MigrationState.Failed {
			t.Errorf("VMI: node %q, migrationState %+v; want failed on source", vmi.Status.NodeName, vmi.Status.MigrationState)
		}
		events := drain(recorder)
		failed := slices.IndexFunc(events, func(e string) bool { return strings.Contains(e, "MigrationFailed") })
		if failed < 0 || strings.Contains(events[failed], "keeps running") || !strings.Contains(events[failed], "no longer on node source") {
			t.Errorf("events %q: want a MigrationFailed Event saying the guest is no longer on the source, not that it keeps running there", events)
		}
	})
}

func drain(recorder *record.FakeRecorder) []string {
	var events []string
	for len(recorder.Events) > 0 {
		events = append(events, <-recorder.Events)
	}
	return events
}

// runStuckMigration runs the source side of a migration of a 1 GiB guest that cannot converge
// before its deadline through fake, and returns the Events and the migration and VMI it left.
func runStuckMigration(t *testing.T, fake Migrator, allowPostCopy, targetPostCopy bool, vmiOpts ...func(*v1alpha1.VirtualMachineInstance)) (*record.FakeRecorder, *v1alpha1.VirtualMachineInstanceMigration, *v1alpha1.VirtualMachineInstance) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm"}}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIRunning, "source"
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "uid-mig"},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
	mig.Status = v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationRunning, SourceNode: "source", TargetNode: "target",
		Cause: v1alpha1.MigrationCauseNodePressure, Deadline: ptr.To(metav1.NewTime(time.Now().Add(20 * time.Second))),
		TargetProxy: &v1alpha1.MigrationProxy{Libvirt: "127.0.0.2:1", Memory: "127.0.0.2:2", PostCopy: targetPostCopy}}
	vmi.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "mig", MigrationUID: "uid-mig"}
	for _, o := range vmiOpts {
		o(vmi)
	}
	config := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
	config.Spec.Migrations = v1alpha1.MigrationsConfig{AllowAutoConverge: ptr.To(false), AllowPostCopy: ptr.To(allowPostCopy), AllowPause: ptr.To(true)}

	client := lifeboatfake.NewSimpleClientset(vmi, mig, config)
	recorder := record.NewFakeRecorder(100)
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := New(Config{
		NodeName: "source", Recorder: recorder, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(), Clock: clk,
	}, client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	informers.Start(ctx.Done())
	informers.WaitForCacheSync(ctx.Done())

	done := make(chan struct{})
	go func() {
		defer close(done)
		a.migrations.runSource(ctx, mig, vmi, fake)
	}()
	// The migration's clock moves a tick at a time until it has run its course.
	if !stepUntil(ctx, clk, progressInterval, func() bool { return closed(done) }) {
		t.Fatal("the migration did not end within 10 s of real time")
	}
	gotMig, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").Get(ctx, "mig", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gotVMI, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(ctx, "vm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return recorder, gotMig, gotVMI
}

type convergeResult struct {
	mode v1alpha1.MigrationMode
	err  error
}

// migrateStepping runs MigrateConverging, moving clk on a tick at a time until it returns;
// false if it did not within 10 s.
func migrateStepping(ctx context.Context, clk *clocktesting.FakeClock, c ConvergingMigration) (convergeResult, bool) {
	done := make(chan convergeResult, 1)
	go func() {
		mode, err := MigrateConverging(ctx, c)
		done <- convergeResult{mode, err}
	}()
	var got convergeResult
	ok := stepUntil(context.Background(), clk, progressInterval, func() bool {
		select {
		case got = <-done:
			return true
		default:
			return false
		}
	})
	return got, ok
}

// stepUntil moves clk on by step whenever the code under test waits on it (a timer or ticker
// of clk's), until done holds; false if that took over 10 s of real time. Stepping only when
// something waits keeps the fake time from running ahead of the code it drives.
func stepUntil(ctx context.Context, clk *clocktesting.FakeClock, step time.Duration, done func() bool) bool {
	err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		if done() {
			return true, nil
		}
		if clk.HasWaiters() {
			clk.Step(step)
		}
		return false, nil
	})
	return err == nil
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestCancelledMigrationIsNotEscalated: a migration its owner cancels (the mark cleared, or a
// KubeVirt-style timeout in the benchmarks) is aborted at the next tick and never escalated,
// though it would miss its deadline.
func TestCancelledMigrationIsNotEscalated(t *testing.T) {
	fake := newStuckMigrator()
	clk := clocktesting.NewFakeClock(time.Now())
	asked := 0
	c := ConvergingMigration{
		Migrator: fake, Domain: "ns_vm", Allowed: Allowed{AutoConverge: true, Pause: true}, Deadline: clk.Now().Add(20 * time.Second),
		Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cancelled: func() bool { asked++; return true },
		Escalated: func(m v1alpha1.MigrationMode, _ Progress) {
			t.Errorf("escalated to %s after the migration was cancelled", m)
		},
	}
	got, ok := migrateStepping(context.Background(), clk, c)
	if !ok {
		t.Fatal("MigrateConverging did not return after the migration was cancelled")
	}
	if !errors.Is(got.err, context.Canceled) || got.mode != v1alpha1.MigrationModePreCopy || asked != 1 {
		t.Errorf("MigrateConverging() = %s, %v after asking %d times; want PreCopy, context.Canceled, asked once", got.mode, got.err, asked)
	}
}

// slowStartMigrator is a migration that cannot converge and whose destination takes a while
// to start: libvirt's first reads show the job's time running but no transfer yet.
type slowStartMigrator struct {
	*stuckMigrator
	clk          *clocktesting.FakeClock
	mu           sync.Mutex
	reads        int
	transferring time.Time
}

func (s *slowStartMigrator) JobStats(name string) (domain.JobStats, error) {
	stats, _ := s.stuckMigrator.JobStats(name)
	stats.Elapsed = 30 * time.Second // libvirt's job time, the destination's start included
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reads++; s.reads <= 10 {
		stats.MemoryBandwidth, stats.MemoryDirtyRate = 0, 0
	} else if s.transferring.IsZero() {
		s.transferring = s.clk.Now()
	}
	return stats, nil
}

// TestConvergenceWarmUpCountsFromTheTransfer: the first pass over memory is judged from when
// the transfer began, not from the job's start, which includes the destination's start-up.
func TestConvergenceWarmUpCountsFromTheTransfer(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	mg := &slowStartMigrator{stuckMigrator: newStuckMigrator(), clk: clk}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	escalated := make(chan time.Time, 1)
	c := ConvergingMigration{
		Migrator: mg, Domain: "ns_vm", Allowed: Allowed{AutoConverge: true, Pause: true}, Deadline: clk.Now().Add(time.Minute),
		Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Escalated: func(v1alpha1.MigrationMode, Progress) {
			escalated <- clk.Now()
			cancel()
		},
	}
	if _, ok := migrateStepping(ctx, clk, c); !ok {
		t.Fatal("MigrateConverging did not escalate a migration that cannot converge")
	}
	mg.mu.Lock()
	defer mg.mu.Unlock()
	at := <-escalated
	if mg.transferring.IsZero() || at.Sub(mg.transferring) < convergenceWarmUp {
		t.Errorf("escalated %s after the transfer began (at read %d), want at least the warm-up of %s", at.Sub(mg.transferring), mg.reads, convergenceWarmUp)
	}
}

func TestMigrationSettings(t *testing.T) {
	config := func(postCopy *bool) *v1alpha1.LifeboatConfig {
		c := &v1alpha1.LifeboatConfig{}
		c.Spec.Migrations.AllowPostCopy = postCopy
		return c
	}
	vmi := func(postCopy *bool) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{}
		if postCopy != nil {
			v.Spec.Migration = &v1alpha1.VMIMigration{AllowPostCopy: postCopy}
		}
		return v
	}
	for _, tc := range []struct {
		name         string
		config       *v1alpha1.LifeboatConfig
		vmi          *v1alpha1.VirtualMachineInstance
		wantPostCopy bool
	}{
		{"no configuration: post-copy off", nil, vmi(nil), false},
		{"the configuration allows it", config(ptr.To(true)), vmi(nil), true},
		{"the VMI opts out", config(ptr.To(true)), vmi(ptr.To(false)), false},
		{"the VMI cannot opt in where the configuration forbids", config(ptr.To(false)), vmi(ptr.To(true)), false},
		{"no VMI (benchmarks): the configuration's", config(ptr.To(true)), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allowed, _ := MigrationSettings(tc.config, tc.vmi)
			if allowed.PostCopy != tc.wantPostCopy {
				t.Errorf("MigrationSettings() allows post-copy: %v, want %v", allowed.PostCopy, tc.wantPostCopy)
			}
		})
	}
}

// dipMigrator is an idle 1 GiB guest's first pass at 64 MiB/s, whose transfer-rate reading
// dips to 1 MiB/s once, as the deadline matrix saw under load; the migration ends after 20 reads.
type dipMigrator struct {
	stuckMigrator
	mu    sync.Mutex
	reads int
	done  chan struct{}
}

func (d *dipMigrator) Migrate(ctx context.Context, _ string, _ domain.MigrateOptions) error {
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *dipMigrator) JobStats(string) (domain.JobStats, error) {
	const mib = 1 << 20
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	if d.reads == 20 {
		close(d.done)
	}
	rate := uint64(64 * mib)
	if d.reads == 8 {
		rate = mib
	}
	return domain.JobStats{Type: domain.JobUnbounded, DataTotal: 1024 * mib, DataRemaining: uint64(900-32*d.reads) * mib,
		MemoryBandwidth: rate, MemoryIteration: 1}, nil
}

func (d *dipMigrator) StartDirtyRateCalc(string, time.Duration, domain.DirtyRateMode) error {
	return nil
}
func (d *dipMigrator) DirtyRate(string) (uint64, bool, error) { return 0, true, nil }

// TestOneDipInTheTransferRateDoesNotPauseTheGuest: the policy judges the median of the recent
// transfer-rate readings, so one reading far below the rate does not send an idle guest with a
// minute to spare to its last resort.
func TestOneDipInTheTransferRateDoesNotPauseTheGuest(t *testing.T) {
	fake := &dipMigrator{done: make(chan struct{})}
	clk := clocktesting.NewFakeClock(time.Now())
	c := ConvergingMigration{
		Migrator: fake, Domain: "ns_vm", Allowed: Allowed{AutoConverge: true, Pause: true}, Deadline: clk.Now().Add(time.Minute),
		Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Escalated: func(m v1alpha1.MigrationMode, _ Progress) { t.Errorf("escalated to %s on one low reading", m) },
	}
	got, ok := migrateStepping(context.Background(), clk, c)
	if !ok {
		t.Fatal("MigrateConverging did not return")
	}
	if got.err != nil || got.mode != v1alpha1.MigrationModePreCopy {
		t.Errorf("MigrateConverging() = %s, %v; want PreCopy, nil", got.mode, got.err)
	}
}

// unsampledMigrator is dipMigrator on a QEMU that cannot sample the dirty rate.
type unsampledMigrator struct{ *dipMigrator }

func (unsampledMigrator) StartDirtyRateCalc(string, time.Duration, domain.DirtyRateMode) error {
	return errors.New("dirty rate measurement not supported")
}

// slowSampleMigrator is dipMigrator whose QEMU is still sampling when the migration ends.
type slowSampleMigrator struct{ *dipMigrator }

func (slowSampleMigrator) DirtyRate(string) (uint64, bool, error) { return 0, false, nil }

// TestTheDirtyRateSampleIsToldOnce: whoever runs the migration (the agent's metrics) learns once
// what became of the sample, however many times the loop reads it.
func TestTheDirtyRateSampleIsToldOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		migrator func(*dipMigrator) Migrator
		want     []SampleResult
	}{
		{"measured", func(d *dipMigrator) Migrator { return d }, []SampleResult{SampleMeasured}},
		{"QEMU cannot measure", func(d *dipMigrator) Migrator { return unsampledMigrator{d} }, []SampleResult{SampleUnavailable}},
		{"the migration ends before the sample", func(d *dipMigrator) Migrator { return slowSampleMigrator{d} }, []SampleResult{SampleLate}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			var told []SampleResult
			c := ConvergingMigration{
				Migrator: tc.migrator(&dipMigrator{done: make(chan struct{})}), Domain: "ns_vm", Deadline: clk.Now().Add(time.Minute),
				Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Sampled: func(r SampleResult, _ uint64) { told = append(told, r) },
			}
			if _, ok := migrateStepping(context.Background(), clk, c); !ok {
				t.Fatal("MigrateConverging did not return")
			}
			if !slices.Equal(told, tc.want) {
				t.Errorf("told of the sample %v, want %v", told, tc.want)
			}
		})
	}
}

func TestRecentRatesMedian(t *testing.T) {
	var r recentRates
	for _, tc := range []struct{ add, want uint64 }{
		{0, 0}, {10, 10}, {0, 10}, {30, 30}, {20, 20}, {1, 20}, {40, 20}, {50, 30}, {60, 40},
	} {
		if got := r.add(tc.add); got != tc.want {
			t.Errorf("add(%d) = %d, want %d (samples %v)", tc.add, got, tc.want, r.samples)
		}
	}
}

// A source agent starts only a migration that the API server still has TargetReady: one that
// acts on an old copy (its node frozen and thawed) must not write Running over a migration that
// failed meanwhile (the soak at 58dadfc: the VM's later migrations were refused for it, and the
// VM was lost at its next eviction).
func TestOnlyATargetReadyMigrationIsStarted(t *testing.T) {
	withPhase := func(p v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
		return &v1alpha1.VirtualMachineInstanceMigration{Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: p}}
	}
	deleting := withPhase(v1alpha1.MigrationTargetReady)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	for _, tc := range []struct {
		name      string
		mig       *v1alpha1.VirtualMachineInstanceMigration
		wantStale bool
	}{
		{"TargetReady", withPhase(v1alpha1.MigrationTargetReady), false},
		{"Failed meanwhile", withPhase(v1alpha1.MigrationFailed), true},
		{"Succeeded", withPhase(v1alpha1.MigrationSucceeded), true},
		{"Running already", withPhase(v1alpha1.MigrationRunning), true},
		{"being deleted", deleting, true},
	} {
		if got := staleStart(tc.mig); (got != "") != tc.wantStale {
			t.Errorf("%s: staleStart() = %q, want stale %v", tc.name, got, tc.wantStale)
		}
	}
}

func TestWithConvergence(t *testing.T) {
	base := domain.MigrateOptions{DestURI: "d", MigrateURI: "m"}
	withDisks := base
	withDisks.DisksURI = "n"
	cases := []struct {
		name      string
		in        domain.MigrateOptions
		allowed   Allowed
		bandwidth uint64
		want      domain.MigrateOptions
	}{
		{"defaults, no disks copied", base, Allowed{AutoConverge: true, Pause: true}, 0,
			domain.MigrateOptions{DestURI: "d", MigrateURI: "m", AutoConverge: true, MaxDowntime: MaxDowntime, PausedOnArrival: true}},
		{"post-copy allowed and a cap", base, Allowed{PostCopy: true}, 64 << 20,
			domain.MigrateOptions{DestURI: "d", MigrateURI: "m", AllowPostCopy: true, Bandwidth: 64 << 20, MaxDowntime: MaxDowntime}},
		{"disks copied: their writes mirrored synchronously", withDisks, Allowed{AutoConverge: true}, 0,
			domain.MigrateOptions{DestURI: "d", MigrateURI: "m", DisksURI: "n", AutoConverge: true, SynchronousDiskWrites: true, MaxDowntime: MaxDowntime, PausedOnArrival: true}},
	}
	for _, tc := range cases {
		if got := WithConvergence(tc.in, tc.allowed, tc.bandwidth); got != tc.want {
			t.Errorf("%s: WithConvergence() = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// passMigrator reports the job statistics its test sets.
type passMigrator struct {
	stuckMigrator
	stats domain.JobStats
}

func (m *passMigrator) JobStats(string) (domain.JobStats, error) { return m.stats, nil }

// TestAPassIsTimedFromWhenItWasSeenToBegin: the policy counts what the guest rewrote during the
// pass under way from the pass's start, which the loop sees as libvirt's pass counter moving; in
// the first pass, from the transfer's start.
func TestAPassIsTimedFromWhenItWasSeenToBegin(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	mg := &passMigrator{}
	c := ConvergingMigration{Migrator: mg, Domain: "ns_vm", Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	st := &loopState{est: dirtyRateEstimate{result: SampleUnavailable}}
	read := func(pass uint64) Progress {
		mg.stats = domain.JobStats{Type: domain.JobUnbounded, DataRemaining: 1 << 30, MemoryBandwidth: 64 << 20, MemoryIteration: pass}
		_, p, err := c.step(v1alpha1.MigrationModePreCopy, 0, st)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	read(1)
	clk.Step(5 * time.Second)
	if p := read(1); p.Pass != 1 || p.PassElapsed != 5*time.Second {
		t.Errorf("5 s into the first pass: pass %d, %s into it; want 1, 5s", p.Pass, p.PassElapsed)
	}
	clk.Step(time.Second)
	if p := read(2); p.Pass != 2 || p.PassElapsed != 0 {
		t.Errorf("at the second pass's first reading: pass %d, %s into it; want 2, 0s", p.Pass, p.PassElapsed)
	}
	clk.Step(3 * time.Second)
	if p := read(2); p.PassElapsed != 3*time.Second || p.Elapsed != 9*time.Second {
		t.Errorf("3 s later: %s into the pass, %s into the transfer; want 3s, 9s", p.PassElapsed, p.Elapsed)
	}
}

// TestTheResidentBoundHoldsOnlyWithoutSwap: the guest's resident memory reaches the policy only
// where the agent found no swap on the node, and then decides: the matrix's 1 GiB guest rewriting
// 256 MiB at half the cap, 2.5 s into its first pass with 12.5 s left, is not paused.
func TestTheResidentBoundHoldsOnlyWithoutSwap(t *testing.T) {
	const mib = 1 << 20
	stats := domain.JobStats{Type: domain.JobUnbounded, DataTotal: 1024 * mib, DataRemaining: 856 * mib, MemoryRemaining: 856 * mib,
		MemoryBandwidth: 65 * mib, MemoryIteration: 1, MemoryNormal: 149 * mib, Resident: 479 * mib}
	for _, tc := range []struct {
		name         string
		swap         uint64
		swapErr      error
		noSwapReader bool
		want         v1alpha1.MigrationMode
	}{
		{"no swap: bounded, auto-converge and no pause yet", 0, nil, false, v1alpha1.MigrationModeAutoConverge},
		{"swap on the node: the rest counted in use, the pause", 2 << 30, nil, false, v1alpha1.MigrationModePaused},
		{"swap unreadable: the pause", 0, errors.New("no meminfo"), false, v1alpha1.MigrationModePaused},
		{"no swap reader: the pause", 0, nil, true, v1alpha1.MigrationModePaused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{cfg: Config{NodeSwap: func() (uint64, error) { return tc.swap, tc.swapErr }}}
			if tc.noSwapReader {
				a.cfg.NodeSwap = nil
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			clk := clocktesting.NewFakeClock(time.Now())
			mg := &passMigrator{stats: stats}
			mg.suspended, mg.postCopied = make(chan struct{}), make(chan struct{})
			c := ConvergingMigration{Migrator: mg, Domain: "ns_vm", Clock: clk, Log: log, Allowed: Allowed{AutoConverge: true, Pause: true},
				Deadline: clk.Now().Add(15 * time.Second), ResidentBounds: a.residentBounds(log)}
			next, p := readTwiceInTheFirstPass(t, c, clk)
			if next != tc.want {
				t.Errorf("after %s: %s, want %s", p, next, tc.want)
			}
		})
	}
}

// readTwiceInTheFirstPass steps c's loop at a reading and 2.5 s later, the guest's dirty rate
// sampled at 31 MiB/s, and returns what the second decided.
func readTwiceInTheFirstPass(t *testing.T, c ConvergingMigration, clk *clocktesting.FakeClock) (v1alpha1.MigrationMode, Progress) {
	t.Helper()
	st := &loopState{est: dirtyRateEstimate{result: SampleMeasured, rate: 31 << 20}}
	if _, _, err := c.step(v1alpha1.MigrationModePreCopy, 0, st); err != nil {
		t.Fatal(err)
	}
	clk.Step(2500 * time.Millisecond)
	next, p, err := c.step(v1alpha1.MigrationModeAutoConverge, 2500*time.Millisecond, st)
	if err != nil {
		t.Fatal(err)
	}
	return next, p
}

// TestTheLaunchersReadingOfTheGuestsRAMTightensTheBound: in the first pass the launcher's reading
// of its guest's RAM bounds what the guest has in use where it is tighter than QEMU's resident
// memory, which counts QEMU's own besides; the guest's other regions count whole. A reading that
// is missing, looser, or beside no memory total from libvirt leaves QEMU's bound; after the first
// pass nobody asks. A 1 GiB guest 2.5 s into its first pass with 12.5 s left, rewriting at half
// the cap: paused by a QEMU that has 800 MiB resident, not yet by its RAM's 375 MiB.
func TestTheLaunchersReadingOfTheGuestsRAMTightensTheBound(t *testing.T) {
	const mib = 1 << 20
	stats := domain.JobStats{Type: domain.JobUnbounded, DataTotal: 1026 * mib, DataRemaining: 856 * mib, MemoryRemaining: 856 * mib, MemoryTotal: 1026 * mib,
		MemoryBandwidth: 65 * mib, MemoryIteration: 1, MemoryNormal: 149 * mib, Resident: 800 * mib}
	for _, tc := range []struct {
		name          string
		resident, ram uint64
		answered      bool
		memoryTotal   uint64
		pass          uint64
		want          v1alpha1.MigrationMode
		wantResident  uint64
		wantAsked     int
	}{
		{"no answer: QEMU's bound, the pause", 0, 0, false, 1026, 1, v1alpha1.MigrationModePaused, 800, 2},
		{"the guest's RAM: bounded tighter, no pause yet", 375, 1024, true, 1026, 1, v1alpha1.MigrationModeAutoConverge, 377, 2},
		{"a reading above QEMU's: QEMU's bound", 1000, 1024, true, 1026, 1, v1alpha1.MigrationModePaused, 800, 2},
		{"no memory total from libvirt: QEMU's bound", 375, 1024, true, 0, 1, v1alpha1.MigrationModePaused, 800, 2},
		{"a later pass: not asked", 375, 1024, true, 1026, 2, "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			clk := clocktesting.NewFakeClock(time.Now())
			s := stats
			s.MemoryTotal, s.MemoryIteration = tc.memoryTotal*mib, tc.pass
			mg := &passMigrator{stats: s}
			mg.suspended, mg.postCopied = make(chan struct{}), make(chan struct{})
			asked := 0
			c := ConvergingMigration{Migrator: mg, Domain: "ns_vm", Clock: clk, Log: log, Allowed: Allowed{AutoConverge: true, Pause: true},
				Deadline: clk.Now().Add(15 * time.Second), ResidentBounds: true,
				GuestRAM: func() (uint64, uint64, bool) { asked++; return tc.resident * mib, tc.ram * mib, tc.answered }}
			next, p := readTwiceInTheFirstPass(t, c, clk)
			if asked != tc.wantAsked {
				t.Errorf("the launcher was asked %d times in two readings, want %d", asked, tc.wantAsked)
			}
			if tc.pass > 1 {
				return
			}
			if p.Resident != tc.wantResident*mib || next != tc.want {
				t.Errorf("after %s: %s with %d MiB resident, want %s with %d MiB", p, next, p.Resident/mib, tc.want, tc.wantResident)
			}
		})
	}
}

func TestGuestRAMBound(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name                  string
		resident, size, total uint64
		want                  uint64
		wantOK                bool
	}{
		{"the RAM's resident and the other regions whole", 300 * mib, 1024 * mib, 1026 * mib, 302 * mib, true},
		{"no memory total", 300 * mib, 1024 * mib, 0, 0, false},
		{"a total below the RAM's size", 300 * mib, 1024 * mib, 512 * mib, 0, false},
		{"more resident than the RAM", 2048 * mib, 1024 * mib, 1026 * mib, 0, false},
	} {
		if got, ok := guestRAMBound(tc.resident, tc.size, tc.total); got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: guestRAMBound = %d MiB, %v; want %d MiB, %v", tc.name, got/mib, ok, tc.want/mib, tc.wantOK)
		}
	}
}
