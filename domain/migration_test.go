package domain_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/migrationpair"
)

// dirtyingGuest is a VMI whose guest keeps rewriting 64 MiB of memory at 256 MiB/s: a
// migration capped at nonConvergingCap finds most of it dirty again on every pass and
// never converges (TestCancelledMigrationLeavesTheGuestOnTheSource shows it).
func dirtyingGuest(t *testing.T, name string) *v1alpha1.VirtualMachineInstance {
	vmi := domain.GuestVMI(t, name, protocol.DirtyParam+"=64M", protocol.DirtyRateParam+"=256M")
	vmi.Spec.Memory = resource.MustParse("256Mi")
	return vmi
}

// nonConvergingCap is a migration bandwidth cap at which dirtyingGuest cannot converge.
const nonConvergingCap = 8 << 20

// migrateAsync runs Migrate in a goroutine and returns its result channel.
func migrateAsync(ctx context.Context, c *domain.Conn, name string, opts domain.MigrateOptions) <-chan error {
	result := make(chan error, 1)
	go func() { result <- c.Migrate(ctx, name, opts) }()
	return result
}

// waitJob polls the named domain's job statistics until done accepts them. It fails at
// once if the migration ends first (its result arrives on ended).
func waitJob(ctx context.Context, c *domain.Conn, name string, ended <-chan error, want string, done func(domain.JobStats) bool) (domain.JobStats, error) {
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	var last domain.JobStats
	var lastErr error
	for {
		last, lastErr = c.JobStats(name)
		if lastErr == nil && done(last) {
			return last, nil
		}
		select {
		case err := <-ended:
			return last, fmt.Errorf("the migration of %s ended (Migrate() = %v) before its job showed %s; last statistics %+v", name, err, want, last)
		case <-ctx.Done():
			return last, fmt.Errorf("waiting for the migration job of %s to show %s: %w; last statistics %+v, error %v", name, want, ctx.Err(), last, lastErr)
		case <-ticker.C:
		}
	}
}

// notConverging waits until the migration is in its third pass over memory or later and
// still has more left than the cap sends in the 300 ms final pause libvirt allows by
// default: it does not converge.
func notConverging(ctx context.Context, c *domain.Conn, name string, ended <-chan error) (domain.JobStats, error) {
	return waitJob(ctx, c, name, ended, "a third pass over memory with more than 300 ms of transfer remaining", func(s domain.JobStats) bool {
		return s.Type == domain.JobUnbounded && s.MemoryIteration >= 3 && s.DataRemaining > nonConvergingCap*3/10
	})
}

// firstCounter is the first complete counter line of a console: the guest's output may
// be split between the source's console and the destination's in the middle of a line.
func firstCounter(console string) (int, bool) {
	lines := strings.Split(console, "\n")
	for _, line := range lines[:len(lines)-1] {
		if rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), protocol.CounterPrefix); ok {
			var n int
			if _, err := fmt.Sscan(rest, &n); err == nil {
				return n, true
			}
		}
	}
	return 0, false
}

// checkMoved checks that the guest left the source and runs on the destination without
// having rebooted: the destination's console goes on counting from where the source's stopped.
func checkMoved(t *testing.T, ctx context.Context, p migrationpair.Pair, name string) {
	t.Helper()
	if _, err := p.Src.Conn.Lookup(name); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("after the migration the source still has domain %s: Lookup() = %v, want ErrNotFound", name, err)
	}
	if state, reason, err := p.Dst.Conn.State(name); err != nil || state != domain.Running {
		t.Errorf("after the migration the destination's domain is %s (%s), error %v; want %s", state, reason, err, domain.Running)
	}
	last, ok := protocol.LastCounter(domain.ReadFile(t, p.Src.Console()))
	if !ok {
		t.Fatalf("the source console has no counter")
	}
	// A few counters: a guest whose memory arrived damaged tends to print one and then panic.
	out, err := guest.WaitForConsole(ctx, p.Dst.Console(), fmt.Sprintf("three counters after %d", last), func(out string) bool {
		first, ok := firstCounter(out)
		n, _ := protocol.LastCounter(out)
		return ok && n >= first+2 || strings.Contains(out, kernelPanic)
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, kernelPanic) {
		t.Fatalf("the guest panicked on the destination:\n%s", out)
	}
	first, _ := firstCounter(out)
	if first <= last || first > last+2 {
		t.Errorf("the destination's counter starts at %d, want it to go on from the source's %d", first, last)
	}
	if guest.HasLine(out, protocol.Ready) {
		t.Errorf("the guest printed %q on the destination: it booted again rather than moving", protocol.Ready)
	}
}

// kernelPanic starts the line a Linux guest prints when it panics.
const kernelPanic = "Kernel panic"

// qemuUsers are the users (real, effective) of the QEMU processes running domain name.
func qemuUsers(t *testing.T, name string) []string {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, p := range procs {
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || !strings.Contains(filepath.Base(strings.Split(string(cmdline), "\x00")[0]), "qemu-system") ||
			!strings.Contains(string(cmdline), "guest="+name+",") {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", p.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "Uid:" {
				users = append(users, f[1]+","+f[2])
			}
		}
	}
	return users
}

// checkLauncherQEMU checks that domain name runs in QEMU, as the launcher's user only.
func checkLauncherQEMU(t *testing.T, name string) {
	t.Helper()
	want := fmt.Sprintf("%d,%d", migrationpair.Launcher.UID, migrationpair.Launcher.UID)
	users := qemuUsers(t, name)
	if len(users) == 0 || slices.ContainsFunc(users, func(u string) bool { return u != want }) {
		t.Errorf("the QEMU processes of %s run as %v (real,effective uid), want them all as %s", name, users, want)
	}
}

func TestMigrationThroughProxiesMovesARunningGuest(t *testing.T) {
	p := migrationpair.New(t)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, domain.GuestVMI(t, "moves"), testAcceleration(t))
	// As in a launcher pod: the daemons and their QEMU are the launcher's user's, never root.
	checkLauncherQEMU(t, name)
	if !p.Src.Conn.Session() || !p.Dst.Conn.Session() {
		t.Errorf("want session daemons of the launcher's user on both nodes")
	}

	start := time.Now()
	if err := p.Src.Conn.Migrate(ctx, name, p.Options(0)); err != nil {
		t.Fatal(err)
	}
	t.Logf("migrated the guest through the proxies in %s", time.Since(start).Round(time.Millisecond))
	checkMoved(t, ctx, p, name)
	checkLauncherQEMU(t, name)
	// The destination keeps the migration's statistics, downtime included: the source domain is gone.
	// The downtime is checked against the job it is part of, not a speed target (those are
	// benchmarks): QEMU overshoots its target on a loaded machine (1.4 s once in CI).
	stats, err := p.Dst.Conn.CompletedJobStats(name)
	if err != nil || stats.Type != domain.JobCompleted || stats.Downtime <= 0 || stats.Downtime > stats.Elapsed {
		t.Errorf("CompletedJobStats() on the destination = %+v, %v; want a completed job with a downtime above 0 and within the job's elapsed time", stats, err)
	}
}

func TestCancelledMigrationLeavesTheGuestOnTheSource(t *testing.T) {
	p := migrationpair.New(t)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, dirtyingGuest(t, "cancelled"), testAcceleration(t))

	migrateCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	result := migrateAsync(migrateCtx, p.Src.Conn, name, p.Options(nonConvergingCap))
	stats, err := notConverging(ctx, p.Src.Conn, name, result)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("not converging after %s: %+v", time.Since(start).Round(time.Millisecond), stats)
	cancel()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Migrate() after cancelling = %v, want an error wrapping context.Canceled", err)
		}
		t.Logf("Migrate() = %v", err)
	case <-ctx.Done():
		t.Fatalf("Migrate() did not return after its context was cancelled: %v", ctx.Err())
	}

	if state, reason, err := p.Src.Conn.State(name); err != nil || state != domain.Running {
		t.Errorf("after the cancelled migration the source's domain is %s (%s), error %v; want %s", state, reason, err, domain.Running)
	}
	if _, err := p.Dst.Conn.Lookup(name); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("after the cancelled migration the destination has domain %s: Lookup() = %v, want ErrNotFound", name, err)
	}
	last, _ := protocol.LastCounter(domain.ReadFile(t, p.Src.Console()))
	if _, err := guest.WaitForConsole(ctx, p.Src.Console(), fmt.Sprintf("a counter after %d on the source", last), func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n > last
	}); err != nil {
		t.Fatal(err)
	}
}

// testAcceleration is how the migration tests run their guests: $LIFEBOAT_TEST_ACCELERATION
// (kvm or tcg), else KVM where a KVM guest boots here (domain.ProbeKVM), else TCG (KVM cannot
// boot Linux on the development machines). So a test that needs KVM skips only where KVM
// cannot run it.
func testAcceleration(t *testing.T) domain.Acceleration {
	t.Helper()
	env := os.Getenv("LIFEBOAT_TEST_ACCELERATION")
	if env == "" {
		a, err := probedAcceleration(t)
		if err != nil {
			t.Fatalf("probing KVM: %v", err)
		}
		return a
	}
	a, err := domain.ParseAcceleration(env)
	if err != nil || a == domain.Auto {
		t.Fatalf("LIFEBOAT_TEST_ACCELERATION=%q: want kvm or tcg", env)
	}
	return a
}

// probedAcceleration is probeAcceleration's answer, probed once per test binary.
var probedAcceleration = func() func(t *testing.T) (domain.Acceleration, error) {
	var once sync.Once
	var a domain.Acceleration
	var err error
	return func(t *testing.T) (domain.Acceleration, error) {
		once.Do(func() { a, err = probeAcceleration(t) })
		return a, err
	}
}()

// probeAcceleration is KVM where a KVM guest prints on this machine, TCG where it does not or
// there is no /dev/kvm, asked of a private daemon of its own.
func probeAcceleration(t *testing.T) (domain.Acceleration, error) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return domain.TCG, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kvm-probe")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	d, err := domain.StartLibvirtd(ctx, domain.Config{Dir: dir})
	if err != nil {
		return "", err
	}
	defer func() { _ = d.Stop() }()
	c, err := domain.Connect(d.Socket())
	if err != nil {
		return "", err
	}
	defer c.Close()
	boot := domain.GuestVMI(t, "probe").Spec.Boot
	return domain.ResolveAcceleration(ctx, c, domain.Auto, boot.Kernel, boot.Initrd)
}

// firstPassMigration starts migrating the named dirtyingGuest at nonConvergingCap, a
// migration that does not converge, and returns Migrate's result channel once some memory
// is sent but the first pass over memory is still under way.
//
// The convergence controls act in the first pass because under TCG, QEMU before 9.0
// (Debian 12's 7.2 here) loses a dirtying guest's writes once a migration syncs the dirty
// bitmap a second time while the guest runs: see requireDirtyTracking. Until that second
// sync every page is sent after the guest's last write to it, so acting in the first pass
// is safe there.
func firstPassMigration(t *testing.T, ctx context.Context, p migrationpair.Pair, name string, allowPostCopy bool) <-chan error {
	t.Helper()
	opts := p.Options(nonConvergingCap)
	opts.AllowPostCopy = allowPostCopy
	start := time.Now()
	result := migrateAsync(ctx, p.Src.Conn, name, opts)
	stats, err := waitJob(ctx, p.Src.Conn, name, result, "16 MiB sent in the first pass", func(s domain.JobStats) bool {
		return s.Type == domain.JobUnbounded && s.DataProcessed >= 16<<20
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.MemoryIteration > 1 {
		t.Fatalf("the migration is past its first pass over memory (%+v); acting now would test TCG's dirty tracking, not lifeboat", stats)
	}
	// The convergence policy bounds what the guest has in use by its resident memory.
	if stats.Resident == 0 || stats.Resident < stats.MemoryNormal {
		t.Fatalf("the first pass's statistics give %d bytes resident for %d sent whole; want at least what was sent whole", stats.Resident, stats.MemoryNormal)
	}
	t.Logf("acting on the migration after %s: %+v", time.Since(start).Round(time.Millisecond), stats)
	return result
}

func TestPostCopyFinishesANonConvergingMigration(t *testing.T) {
	p := migrationpair.New(t)
	// Under TCG on QEMU 7.2 the guest panicked on the destination (seen in CI) although the
	// switch came in the first pass; on QEMU 10.0 it passed 3 runs of 3. Post-copy syncs the
	// dirty bitmap again while the guest runs, which is where the TCG bug hits.
	requireDirtyTracking(t, p.Src.Conn)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, dirtyingGuest(t, "postcopy"), testAcceleration(t))

	start := time.Now()
	result := firstPassMigration(t, ctx, p, name, true)
	if err := p.Src.Conn.StartPostCopy(name); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err != nil {
		t.Fatalf("Migrate() after switching to post-copy: %v", err)
	}
	t.Logf("migrated in %s", time.Since(start).Round(time.Millisecond))
	checkMoved(t, ctx, p, name)
}

// waitState waits until the named domain on c is in state for reason.
func waitState(t *testing.T, c *domain.Conn, name string, state domain.State, reason domain.Reason) {
	t.Helper()
	type stateReason struct {
		State  domain.State
		Reason domain.Reason
	}
	kubewait.For(t, time.Minute, fmt.Sprintf("domain %s %s (%s)", name, state, reason), func(context.Context) (stateReason, error) {
		s, r, err := c.State(name)
		return stateReason{s, r}, err
	}, func(s stateReason) bool { return s.State == state && s.Reason == reason }, nil)
}

// A post-copy migration whose connection breaks (a network failure, an agent's restart) leaves
// the guest paused on both nodes, the source holding the pages the destination lacks: resuming
// it over new connections moves the guest intact.
//
// Under TCG it cannot. TCG delivers an interrupt holding QEMU's big lock, reading the guest's
// IDT and stack through its page tables; where one of those pages is still on the source, the
// vCPU waits in the kernel's userfaultfd with the lock held, and after the break no page comes.
// QEMU's main loop then waits for the lock, so the destination's libvirt hangs in its first
// query for the resume (QEMU 10.0, libvirt 9.0; gdb on the destination's QEMU showed the vCPU
// in do_interrupt_all → x86_cpu_tlb_fill → handle_userfault and the main thread in bql_lock).
// KVM delivers interrupts in the kernel, without that lock. Pausing the destination's vCPU
// before the break would avoid it, but libvirt lets nothing but a destroy (no suspend, no
// monitor command) in beside an incoming migration's job. The test runs where guests run
// under KVM.
func TestPostCopyResumesAfterTheConnectionBreaks(t *testing.T) {
	if testAcceleration(t) == domain.TCG {
		t.Skip("needs KVM (a host where a KVM guest boots, or LIFEBOAT_TEST_ACCELERATION=kvm): under TCG a vCPU that faults on a missing page while delivering an interrupt holds QEMU's big lock, so after the break the destination's QEMU stops answering libvirt; make test lists this skip")
	}
	p := migrationpair.New(t)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, dirtyingGuest(t, "resume"), testAcceleration(t))

	result := firstPassMigration(t, ctx, p, name, true)
	// Slow enough that the connection breaks with most of the memory still on the source: a
	// slow network, since QEMU sends the pages the destination asks for whatever its cap, and
	// this guest asks for pages all the time.
	p.Throttle(nonConvergingCap)
	if err := p.Src.Conn.StartPostCopy(name); err != nil {
		t.Fatal(err)
	}
	waitState(t, p.Dst.Conn, name, domain.Running, domain.ReasonPostcopy)
	if n := p.BreakConnections(); n == 0 {
		t.Fatal("no connection between the nodes to break")
	}
	if err := <-result; err == nil {
		t.Fatal("Migrate() = nil after the connection broke in post-copy, want an error")
	} else {
		t.Logf("the broken migration: %v", err)
	}
	waitState(t, p.Src.Conn, name, domain.Paused, domain.ReasonPostcopyFailed)

	p.Throttle(0) // the rest of the memory comes at once
	opts := p.Options(nonConvergingCap)
	opts.PostCopyResume = true
	// The source's QEMU notices the break a moment after its libvirt does; until then libvirt
	// refuses the resume ("QEMU reports migration is still running"). Its libvirt also holds the
	// broken migration's job a moment after Migrate returned ("being actively monitored by
	// another thread").
	var last error
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last = p.Src.Conn.Migrate(ctx, name, opts)
		if last != nil && !strings.Contains(last.Error(), "still running") && !strings.Contains(last.Error(), "actively monitored") {
			return false, last
		}
		return last == nil, nil
	}); err != nil {
		t.Fatalf("Migrate() resuming post-copy: %v (last: %v)", err, last)
	}
	checkMoved(t, ctx, p, name)
}

func TestPausingFinishesANonConvergingMigration(t *testing.T) {
	p := migrationpair.New(t)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, dirtyingGuest(t, "paused"), testAcceleration(t))

	start := time.Now()
	result := firstPassMigration(t, ctx, p, name, false)
	if err := p.Src.Conn.Suspend(name); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err != nil {
		t.Fatalf("Migrate() after pausing the guest: %v", err)
	}
	t.Logf("migrated in %s", time.Since(start).Round(time.Millisecond))
	// checkMoved also checks that the guest paused on the source runs on the destination
	// without being resumed there: libvirt resumes it when the migration ends.
	checkMoved(t, ctx, p, name)
}

// fixedTCGDirtyTracking is the first QEMU release, in libvirt's encoding of versions
// (major*1,000,000 + minor*1,000 + micro), whose TCG keeps a migration's dirty bitmap
// coherent with the guest's stores: 9.0.0, with upstream commit 03bfc2188f ("physmem: Fix
// migration dirty bitmap coherency with TCG memory access"), which the 7.2 stable
// releases (Debian 12's 7.2.22 included) lack.
const fixedTCGDirtyTracking = 9_000_000

// requireDirtyTracking skips a test that migrates a dirtying guest past its first pass over
// memory when the guest runs under TCG on a QEMU older than 9.0. There, the aligned fast
// path of the dirty bitmap sync clears a page's dirty bit without making TCG's TLB trap
// the next store to it, so writes after the second sync are never sent and the guest
// arrives with stale memory (it panicked within seconds of arriving in 5 migrations out of
// 5 here). KVM tracks dirty pages in the kernel and is not affected.
func requireDirtyTracking(t *testing.T, c *domain.Conn) {
	t.Helper()
	if testAcceleration(t) != domain.TCG {
		return
	}
	version, err := domain.QEMUVersion(c)
	if err != nil {
		t.Fatalf("reading the QEMU version: %v", err)
	}
	if version < fixedTCGDirtyTracking {
		t.Skipf("needs KVM (LIFEBOAT_TEST_ACCELERATION=kvm) or QEMU >= 9.0 (commit 03bfc2188f): QEMU %d.%d.%d under TCG "+
			"loses the writes of a guest migrated past its first pass over memory", version/1_000_000, version/1_000%1_000, version%1_000)
	}
}

// convergingCap is a migration bandwidth cap at which convergingDirtyingGuest needs several
// passes over memory: each pass finds half as much dirty memory as the one before.
const convergingCap = 16 << 20

// convergingDirtyingGuest is a VMI whose guest keeps rewriting 64 MiB of memory at 8 MiB/s.
func convergingDirtyingGuest(t *testing.T, name string) *v1alpha1.VirtualMachineInstance {
	vmi := domain.GuestVMI(t, name, protocol.DirtyParam+"=64M", protocol.DirtyRateParam+"=8M")
	vmi.Spec.Memory = resource.MustParse("256Mi")
	return vmi
}

func TestMigrationPastTheFirstPassMovesADirtyingGuestIntact(t *testing.T) {
	p := migrationpair.New(t)
	requireDirtyTracking(t, p.Src.Conn)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, convergingDirtyingGuest(t, "passes"), testAcceleration(t))

	start := time.Now()
	result := migrateAsync(ctx, p.Src.Conn, name, p.Options(convergingCap))
	stats, err := waitJob(ctx, p.Src.Conn, name, result, "a second pass over memory", func(s domain.JobStats) bool {
		return s.MemoryIteration >= 2
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second pass after %s: %+v", time.Since(start).Round(time.Millisecond), stats)
	if err := <-result; err != nil {
		t.Fatalf("Migrate() = %v", err)
	}
	t.Logf("migrated in %s", time.Since(start).Round(time.Millisecond))
	checkMoved(t, ctx, p, name)
}
