package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/internal/chart"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/migrationpair"
)

func TestMain(m *testing.M) {
	// The private libvirt daemons of the deadline matrix are this binary, re-executed.
	domain.MaybeRunLibvirtdShim()
	// The harness's informational lines (a QEMU left behind at a daemon's stop) come while a
	// benchmark runs, between its name and its figures, and split both and its log lines: the
	// matrix's log could not be matched to its cells.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	code := m.Run()
	matrix.print(os.Stdout)
	if dir := chart.Dir(); dir != "" {
		if err := matrix.charts(dir); err != nil {
			fmt.Fprintf(os.Stderr, "drawing the deadline matrix's charts: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

const mib = 1 << 20

// matrixCap caps every migration of the deadline matrix, so that one machine's loopback
// behaves like a network: 64 MiB/s is about a 0.5 Gbit/s link.
const matrixCap = 64 * mib

// dirtyFactors are the guest's dirty rates as fractions of matrixCap.
var dirtyFactors = []struct {
	name     string
	num, den uint64
}{{"0", 0, 1}, {"0.5x", 1, 2}, {"0.75x", 3, 4}, {"1.5x", 3, 2}}

var (
	matrixMemories = []uint64{256 * mib, 1024 * mib}
	matrixGraces   = []time.Duration{15 * time.Second, 30 * time.Second, 60 * time.Second}
)

// The disk-writing guests: a 256 MiB guest whose memory stays still writes a containerDisk's
// overlay at a fraction of matrixCap (diskFactors), round diskSpan of the disk, so that a
// migration copies the overlay (libvirt's non-shared-disk copy over NBD, through the proxies)
// while the guest keeps changing it.
const (
	diskMemory = 256 * mib
	diskSpan   = 128 * mib
	// diskImageSize is the containerDisk's image: the span after the journal, and some room.
	diskImageSize = protocol.DiskWriteOffset + diskSpan + 16*mib
)

// The guests whose working set is smaller than their memory: a 1 GiB guest rewriting 256 MiB,
// at and around the cap, so that pre-copy cannot converge at 1 × and 1½ × and the pause's floor
// (its working set ÷ the cap) is a quarter of what a pause with all its memory left would cost.
const (
	smallSetMemory = 1024 * mib
	smallSet       = 256 * mib
)

var smallSetFactors = []struct {
	name     string
	num, den uint64
}{{"0.5x", 1, 2}, {"1x", 1, 1}, {"1.5x", 3, 2}}

var diskFactors = []struct {
	name     string
	num, den uint64
}{{"0.5x", 1, 2}, {"1.5x", 3, 2}}

// KubeVirt's migration defaults: no auto-converge, no post-copy, and the migration is aborted
// after completionTimeoutPerGiB per GB of guest memory (rounded up, as KubeVirt's
// getVMIMigrationDataSize does with ScaledValue(Giga)) or after progressTimeout without progress.
const (
	kubevirtCompletionTimeoutPerGiB = 150 * time.Second
	kubevirtProgressTimeout         = 150 * time.Second
)

// dirtySize is how much of a guest's memory the test guest fills with non-zero pages, so that
// a migration has to send (nearly) all of it: the rest is the kernel's, the initramfs's and
// init's (about 60 MiB and 1/8 of the memory in use after boot; the guest keeps 24 MiB free).
func dirtySize(memory uint64) uint64 { return memory - 64*mib - memory/8 }

// BenchmarkDeadlineMatrix migrates real TCG guests between two private libvirt daemons through
// the agents' migration proxies, for each guest size × dirty rate, with four policies in the
// same run, interleaved: per grace period, lifeboat's (the agent's own convergence loop,
// agent.MigrateConverging, with a deadline at the grace) with LifeboatConfig's default modes and
// with post-copy allowed; and, once per guest since they do not know the grace, KubeVirt's
// defaults (plain pre-copy) and KubeVirt's with allowAutoConverge and allowPostCopy. The table
// printed at the end has the medians over -count runs and the worst downtime the guest saw.
func BenchmarkDeadlineMatrix(b *testing.B) {
	img, err := guest.Ensure(b.Context(), os.Stderr)
	if err != nil {
		b.Fatalf("building the test guest: %v", err)
	}
	for _, mem := range matrixMemories {
		for _, f := range dirtyFactors {
			cell := matrixCell{memory: mem, dirtyRate: matrixCap * f.num / f.den, factor: f.name}
			runCell(b, img, cell, fmt.Sprintf("mem=%dMi/dirty=%s", mem/mib, f.name))
		}
	}
	for _, f := range smallSetFactors {
		cell := matrixCell{memory: smallSetMemory, workingSet: smallSet, dirtyRate: matrixCap * f.num / f.den, factor: f.name}
		runCell(b, img, cell, fmt.Sprintf("mem=%dMi/ws=%dMi/dirty=%s", smallSetMemory/mib, smallSet/mib, f.name))
	}
	for _, f := range diskFactors {
		cell := matrixCell{memory: diskMemory, factor: dirtyFactors[0].name, diskRate: matrixCap * f.num / f.den, diskFactor: f.name}
		runCell(b, img, cell, fmt.Sprintf("mem=%dMi/dirty=%s/disk=%s", diskMemory/mib, cell.factor, f.name))
	}
}

// runCell migrates cell's guest with KubeVirt's policies, then with lifeboat's at each grace.
func runCell(b *testing.B, img guest.Image, cell matrixCell, name string) {
	for _, kv := range kubevirtPolicies {
		b.Run(fmt.Sprintf("%s/policy=%s", name, kv), func(b *testing.B) {
			for b.Loop() {
				matrix.add(cell, kv, migrateOnce(b, img, cell, kubevirtPolicy(cell.memory, kv == policyKubeVirtTuned)))
			}
		})
	}
	for _, grace := range matrixGraces {
		c := cell
		c.grace = grace
		for _, lb := range lifeboatPolicies {
			b.Run(fmt.Sprintf("%s/grace=%s/policy=%s", name, grace, lb), func(b *testing.B) {
				for b.Loop() {
					matrix.add(c, lb, migrateOnce(b, img, c, lifeboatPolicy(grace, lb == policyLifeboatPostCopy)))
				}
			})
		}
	}
}

// The matrix's policies.
const (
	policyLifeboat         = "lifeboat"
	policyLifeboatPostCopy = "lifeboat+postcopy"
	policyKubeVirt         = "kubevirt"
	policyKubeVirtTuned    = "kubevirt+autoconverge+postcopy"
)

var (
	lifeboatPolicies = []string{policyLifeboat, policyLifeboatPostCopy}
	kubevirtPolicies = []string{policyKubeVirt, policyKubeVirtTuned}
	matrixPolicies   = []string{policyLifeboat, policyLifeboatPostCopy, policyKubeVirt, policyKubeVirtTuned}
)

// matrixCell is a guest and, for lifeboat's policy, the grace period it is given (zero for
// KubeVirt's, which does not know of one).
type matrixCell struct {
	memory, dirtyRate uint64
	factor            string
	// workingSet is what the guest rewrites (lifeboat.dirty); 0 for dirtySize(memory).
	workingSet uint64
	// diskRate is how fast the guest writes its containerDisk (diskSpan of it); 0 for no disk.
	diskRate   uint64
	diskFactor string
	grace      time.Duration
}

// dirtySet is what the guest fills and keeps rewriting.
func (c matrixCell) dirtySet() uint64 {
	if c.workingSet > 0 {
		return c.workingSet
	}
	return dirtySize(c.memory)
}

// floor is the shortest a pause of the cell's guest can stop it when pre-copy cannot end in
// time: what the guest rewrites while a pass sends its working set (all of it when it writes at
// the cap or faster), ÷ the cap, and the switch-over. For a guest writing slower than the cap,
// pre-copy's later passes would leave less: it is the floor of a pause after one pass.
func (c matrixCell) floor() time.Duration {
	set := c.dirtySet()
	rewritten := min(set, uint64(float64(c.dirtyRate)*float64(set)/matrixCap))
	return time.Duration(float64(rewritten)/matrixCap*float64(time.Second)) + agent.SwitchOver
}

// medianRate is the median of rates, 0 for none.
func medianRate(rates []int64) uint64 {
	if len(rates) == 0 {
		return 0
	}
	rates = slices.Clone(rates)
	slices.Sort(rates)
	return uint64(rates[len(rates)/2])
}

// guestString is the memory column of the table: the guest's memory, and the disk it writes:
// the rate asked and the median of the rates its passes over the disk had before the migrations.
func (c matrixCell) guestString(runs []outcome) string {
	if c.diskRate == 0 && c.workingSet > 0 {
		return fmt.Sprintf("%d MiB, rewriting %d MiB", c.memory/mib, c.workingSet/mib)
	}
	if c.diskRate == 0 {
		return fmt.Sprintf("%d MiB", c.memory/mib)
	}
	median := func(f func(outcome) uint64) uint64 {
		v := collect(runs, f)
		slices.Sort(v)
		return v[len(v)/2]
	}
	return fmt.Sprintf("%d MiB, disk %d MiB written at %s = %d MiB/s (seen %d MiB/s before the migration, %d during)", c.memory/mib, diskSpan/mib,
		c.diskFactor, c.diskRate/mib, median(func(o outcome) uint64 { return o.diskSeen })/mib, median(func(o outcome) uint64 { return o.diskDuring })/mib)
}

// bound is the shortest a migration of the cell can take at matrixCap: its memory, and the
// overlay's span, which the guest has written whole before the migration starts.
func (c matrixCell) bound() time.Duration {
	bytes := c.memory
	if c.diskRate > 0 {
		bytes += diskSpan
	}
	return time.Duration(float64(bytes) / matrixCap * float64(time.Second))
}

// policy turns a migration into a ConvergingMigration: its allowed modes, deadline and abort rule.
type policy func(c *agent.ConvergingMigration, start time.Time, stats func() domain.JobStats)

// lifeboatPolicy is the agent's: LifeboatConfig's defaults with the bandwidth cap (and post-copy
// allowed when postCopy), and the kubelet's deadline at the grace period from the start.
func lifeboatPolicy(grace time.Duration, postCopy bool) policy {
	return func(c *agent.ConvergingMigration, start time.Time, _ func() domain.JobStats) {
		config := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
		config.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse(fmt.Sprintf("%dMi", matrixCap/mib)))
		config.Spec.Migrations.AllowPostCopy = ptr.To(postCopy)
		allowed, bandwidth := agent.MigrationSettings(config, nil)
		c.Allowed, c.Options = allowed, agent.WithConvergence(c.Options, allowed, bandwidth)
		c.Deadline = start.Add(grace)
	}
}

// kubevirtPolicy is KubeVirt's pre-copy, aborted by its completion and progress timeouts, or at
// the longest grace of the matrix, when every deadline has passed and the kubelet would have
// killed the VM. Tuned is a migration policy with allowAutoConverge and allowPostCopy: QEMU
// throttles from the start, and KubeVirt switches to post-copy where it would otherwise abort
// at the completion timeout, 150 s here, later than every grace: within the matrix it never does.
func kubevirtPolicy(memory uint64, tuned bool) policy {
	gb := resource.NewQuantity(int64(memory), resource.BinarySI).ScaledValue(resource.Giga)
	completion := time.Duration(gb) * kubevirtCompletionTimeoutPerGiB
	cut := min(completion, slices.Max(matrixGraces))
	return func(c *agent.ConvergingMigration, start time.Time, stats func() domain.JobStats) {
		c.Options.Bandwidth = matrixCap
		c.Options.AutoConverge, c.Options.AllowPostCopy = tuned, tuned
		lastRemaining, lastProgress := uint64(0), start
		c.Cancelled = func() bool {
			now := time.Now()
			if s := stats(); s.DataRemaining > 0 && (lastRemaining == 0 || s.DataRemaining < lastRemaining) {
				lastRemaining, lastProgress = s.DataRemaining, now
			}
			return now.Sub(start) >= cut || now.Sub(lastProgress) >= kubevirtProgressTimeout
		}
	}
}

// warm samples the named guest's dirty rate once, as the agent does when it first sees a guest
// run (agent.WarmDirtyRate), and waits for the sample's end: a migration started while it runs
// would read it, QEMU's first of the domain, which reads low.
func warm(b *testing.B, conn *domain.Conn, name string) {
	b.Helper()
	if err := agent.WarmDirtyRate(conn, name); err != nil {
		b.Fatalf("warming the guest's page sampling: %v", err)
	}
	kubewait.For(b, time.Minute, "the warm-up's dirty-rate sample to end",
		func(context.Context) (bool, error) { _, ok, err := conn.DirtyRate(name); return ok, err },
		func(ok bool) bool { return ok }, nil)
}

// recordingMigrator is the source daemon's connection, noting what the convergence loop saw
// and did: the job statistics it read and when it paused the guest.
type recordingMigrator struct {
	agent.Migrator
	mu       sync.Mutex
	last     domain.JobStats
	maxDirty uint64   // highest dirty rate libvirt reported before any escalation
	rates    []uint64 // transfer rates libvirt reported
	// transferring is when libvirt first reported a transfer rate: before it, the
	// destination QEMU was being started.
	transferring time.Time
	// slowestRead is the longest a read of the running job's statistics took: the policy
	// acts no faster than it reads.
	slowestRead time.Duration
	escalate    bool
	pausedAt    time.Time
	// start and samples are the migration's timeline: every reading of the running job.
	start   time.Time
	samples []chart.Sample
}

func (r *recordingMigrator) JobStats(name string) (domain.JobStats, error) {
	start := time.Now()
	s, err := r.Migrator.JobStats(name)
	if err == nil && s.Type == domain.JobUnbounded {
		r.mu.Lock()
		r.slowestRead = max(r.slowestRead, time.Since(start))
		r.last = s
		r.samples = append(r.samples, chart.Sample{At: time.Since(r.start), Remaining: s.DataRemaining, DirtyRate: s.MemoryDirtyRate, TransferRate: s.MemoryBandwidth})
		if s.MemoryBandwidth > 0 {
			r.rates = append(r.rates, s.MemoryBandwidth)
			if r.transferring.IsZero() {
				r.transferring = time.Now()
			}
		}
		if !r.escalate {
			r.maxDirty = max(r.maxDirty, s.MemoryDirtyRate)
		}
		r.mu.Unlock()
	}
	return s, err
}

func (r *recordingMigrator) Suspend(name string) error {
	err := r.Migrator.Suspend(name)
	if err == nil {
		r.mu.Lock()
		r.pausedAt = time.Now()
		r.mu.Unlock()
	}
	return err
}

func (r *recordingMigrator) escalated() {
	r.mu.Lock()
	r.escalate = true
	r.mu.Unlock()
}

func (r *recordingMigrator) stats() domain.JobStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// outcome is one migration of the matrix.
type outcome struct {
	finished       bool // the guest runs on the destination
	total          time.Duration
	setup          time.Duration // until the memory transfer began (to the statistics' 0.5 s)
	downtime       time.Duration
	modes          []v1alpha1.MigrationMode
	maxDirty       uint64
	slowestRead    time.Duration
	transferRate   uint64 // median of what libvirt reported
	guestAfterward string // what the guest's console shows on the destination
	// guestDowntime is how long the guest's counter stood still beyond its tick across the
	// switch-over, from the last counter on the source's console to the first on the
	// destination's (the guest's clock stops while it is paused); longestStall is the longest
	// anywhere, which for a guest writing its disk can come before or after the switch.
	guestDowntime, longestStall time.Duration
	estimate                    uint64
	estimated                   bool
	// diskSeen and diskDuring are the median rates of the guest's passes over its disk that
	// ended before the migration and while it ran (on the source): what the copy cost the guest.
	diskSeen, diskDuring uint64
	timeline             chart.Timeline
}

// migrateOnce boots the cell's guest on a fresh pair of daemons and migrates it with pol.
func migrateOnce(b *testing.B, img guest.Image, cell matrixCell, pol policy) outcome {
	p := migrationpair.New(b)
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	vmi := matrixGuest(img, cell)
	if cell.diskRate > 0 {
		p.WithContainerDisk(b, vmi, "data", diskImageSize)
	}
	name := p.RunGuest(b, ctx, vmi, domain.TCG)
	size := int64(cell.dirtySet())
	// The guest has printed whether it dirties its memory before it counts.
	if console := readOrEmpty(p.Src.Console()); !guest.HasLine(console, protocol.Dirtying(size, int64(cell.dirtyRate))) {
		b.Fatalf("the guest does not dirty its memory as asked (%d bytes at %d bytes/s):\n%s", size, cell.dirtyRate, console)
	}
	if cell.diskRate > 0 {
		// The whole span written once: the overlay the migration copies is as large as it gets.
		if _, err := guest.WaitForConsole(ctx, p.Src.Console(), "the first pass over the disk", func(out string) bool {
			_, ok := protocol.LastDiskPass(out, matrixDisk)
			return ok
		}); err != nil {
			b.Fatalf("the guest does not write its disk as asked (%d bytes at %d bytes/s): %v\n%s", diskSpan, cell.diskRate, err, readOrEmpty(p.Src.Console()))
		}
	}

	warm(b, p.Src.Conn, name)

	_, passRates := protocol.DiskPasses(readOrEmpty(p.Src.Console()), matrixDisk)
	watch := guest.WatchCounters(ctx, matrixTick, func() []string { return []string{p.Src.Console(), p.Dst.Console()} })
	rec := &recordingMigrator{Migrator: p.Src.Conn, start: time.Now()}
	// As the source launcher does: lifeboat's policies leave the guest paused on arrival.
	handoffs := p.HandOffs(b, ctx, name)
	swap, swapErr := pressure.SwapTotal("/proc")
	if swapErr != nil {
		b.Fatal(swapErr)
	}
	ramSize, err := p.Src.Conn.MemorySize(name)
	if err != nil {
		b.Fatal(err)
	}
	c := agent.ConvergingMigration{
		Migrator: rec, Domain: name, Options: p.Options(0), Clock: clock.RealClock{},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), ResidentBounds: swap == 0,
		// As the source launcher answers its agent.
		GuestRAM: func() (uint64, uint64, bool) {
			resident, err := p.Src.Daemon.GuestMemoryResident(name, ramSize)
			return resident, ramSize, err == nil
		},
	}
	modes := []v1alpha1.MigrationMode{v1alpha1.MigrationModePreCopy}
	var lastStep agent.Progress // what the policy saw at its last step up
	// The page-sampling dirty rate the policy got, if it got one.
	var estimate uint64
	var estimated bool
	c.Sampled = func(r agent.SampleResult, rate uint64) {
		estimate, estimated = rate, r == agent.SampleMeasured
	}
	// The switch-over: a pause or post-copy, when the policy steps up to one; otherwise the
	// end of pre-copy's last pass (the migration's return less libvirt's downtime).
	var switched time.Time
	c.Escalated = func(m v1alpha1.MigrationMode, p agent.Progress) {
		rec.escalated()
		modes, lastStep = append(modes, m), p
		if m == v1alpha1.MigrationModePaused || m == v1alpha1.MigrationModePostCopy {
			switched = time.Now()
		}
	}
	start := time.Now()
	rec.start = start
	pol(&c, start, rec.stats)
	_, err = agent.MigrateConverging(ctx, c)
	end := time.Now()

	o := outcome{finished: err == nil, total: end.Sub(start), modes: modes, maxDirty: rec.maxDirty, slowestRead: rec.slowestRead,
		estimate: estimate, estimated: estimated}
	_, allRates := protocol.DiskPasses(readOrEmpty(p.Src.Console()), matrixDisk)
	o.diskSeen, o.diskDuring = medianRate(passRates), medianRate(allRates[len(passRates):])
	if len(rec.rates) > 0 {
		slices.Sort(rec.rates)
		o.transferRate = rec.rates[len(rec.rates)/2]
		o.setup = rec.transferring.Sub(start)
	}
	b.ReportMetric(o.total.Seconds(), "s/migration")
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			b.Logf("the migration failed: %v", err)
		}
		o.guestAfterward = "not moved"
		return o
	}
	if s, err := p.Dst.Conn.CompletedJobStats(name); err == nil {
		o.downtime = s.Downtime
	}
	if !rec.pausedAt.IsZero() {
		// Paused to converge: the guest stood still from then until it ran on the destination.
		o.downtime = max(o.downtime, end.Sub(rec.pausedAt))
	}
	if switched.IsZero() {
		switched = end.Add(-o.downtime)
	}
	o.timeline = chart.Timeline{Samples: rec.samples, Switch: switched.Sub(start), Done: o.total}
	if !c.Deadline.IsZero() {
		o.timeline.Deadline = c.Deadline.Sub(start)
	}
	if c.Options.PausedOnArrival {
		select {
		case h := <-handoffs:
			if h.Err != nil || h.Result != domain.HandoffResumed {
				b.Logf("the hand-off to the destination ended %s: %v", h.Result, h.Err)
			}
		case <-ctx.Done():
		}
	}
	o.guestAfterward = guestAfterward(ctx, p, cell)
	stall := watch()
	o.guestDowntime, o.longestStall = stall.Switch, stall.Longest
	if len(modes) > 1 {
		b.Logf("the last step, to %s, came at %s", modes[len(modes)-1], lastStep)
	}
	b.Logf("%s in %s (transfer from %s), downtime %s (libvirt's %s; the longest stall %s, ended %s from the migration's return), dirty rate estimated %d MiB/s (%v), seen %d MiB/s, disk written at %d MiB/s before and %d MiB/s during, transfer rate %d MiB/s, slowest statistics read %s, guest afterwards: %s",
		modeString(o.modes), o.total.Round(10*time.Millisecond), o.setup.Round(100*time.Millisecond), o.guestDowntime.Round(time.Millisecond), o.downtime.Round(time.Millisecond), o.longestStall.Round(time.Millisecond), stall.Ended.Sub(end).Round(time.Millisecond),
		o.estimate/mib, o.estimated, o.maxDirty/mib, o.diskSeen/mib, o.diskDuring/mib, o.transferRate/mib, o.slowestRead.Round(time.Millisecond), o.guestAfterward)
	return o
}

// matrixTick is how often the matrix's guests print their counter: the precision of the
// downtime they are seen to have.
const matrixTick = 50 * time.Millisecond

// matrixDisk is the disk the matrix's guest writes: its first (virtio) disk.
const matrixDisk = "vda"

// matrixGuest fills dirtySize of the cell's memory and keeps rewriting it at the cell's dirty
// rate, and writes its disk at the cell's disk rate.
func matrixGuest(img guest.Image, cell matrixCell) *v1alpha1.VirtualMachineInstance {
	cmdline := fmt.Sprintf("%s %s=%d %s=%d %s=%s", guest.Cmdline, protocol.DirtyParam, cell.dirtySet(), protocol.DirtyRateParam, cell.dirtyRate,
		protocol.TickParam, matrixTick)
	if cell.diskRate > 0 {
		cmdline += fmt.Sprintf(" %s=%d %s=%d", protocol.DiskRateParam, cell.diskRate, protocol.DiskSpanParam, diskSpan)
	}
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "matrix", UID: types.UID(uuid.NewString())},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 1, Memory: *resource.NewQuantity(int64(cell.memory), resource.BinarySI),
			Boot: v1alpha1.BootSource{Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: cmdline},
		},
	}
}

// guestAfterward tells whether the guest counts on at the destination, or panicked (under TCG,
// a guest that writes memory can arrive damaged; see domain's migration tests). A guest writing
// its disk must also finish a pass over it there, each block checked before it is written again:
// "disk intact", or "disk damaged" with the guest's error line, or "disk stalled".
func guestAfterward(ctx context.Context, p migrationpair.Pair, cell matrixCell) string {
	last, _ := protocol.LastCounter(readOrEmpty(p.Src.Console()))
	wait := 10 * time.Second
	if cell.diskRate > 0 {
		// Two passes at the asked rate: the one under way when the guest arrived, and the next.
		wait += 2 * time.Duration(float64(diskSpan)/float64(cell.diskRate)*float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	out, err := guest.WaitForConsole(ctx, p.Dst.Console(), "a counter or a panic", func(out string) bool {
		n, ok := protocol.LastCounter(out)
		if cell.diskRate > 0 && !strings.Contains(out, protocol.ErrorPrefix) {
			ok = ok && hasPassAfter(out, p.Src.Console())
		}
		return ok && n > last+1 || strings.Contains(out, "Kernel panic") || strings.Contains(out, protocol.ErrorPrefix)
	})
	switch {
	case strings.Contains(out, "Kernel panic"):
		return "panicked"
	case strings.Contains(out, protocol.ErrorPrefix):
		return "disk damaged"
	case err != nil && cell.diskRate > 0:
		return "disk stalled"
	case err != nil:
		return "silent"
	case cell.diskRate > 0:
		return guestIntact
	}
	return "counting"
}

// guestIntact is guestAfterward's word for a disk-writing guest that arrived whole.
const guestIntact = "counting, disk intact"

// expectArrivedWhole fails the benchmark unless guestAfterward found the guest whole on the
// destination: counting on, and with its disk intact if it writes one.
func expectArrivedWhole(b *testing.B, afterward string, cell matrixCell) {
	b.Helper()
	want := "counting"
	if cell.diskRate > 0 {
		want = guestIntact
	}
	if afterward != want {
		b.Errorf("after the migration the guest is %q, want %q", afterward, want)
	}
}

// hasPassAfter reports whether the destination's console shows the end of the pass after the
// one under way at the migration: by then every block, including those the source wrote last,
// was read back on the destination and found as the source left it.
func hasPassAfter(dst, srcConsole string) bool {
	last, _ := protocol.LastDiskPass(readOrEmpty(srcConsole), matrixDisk)
	n, ok := protocol.LastDiskPass(dst, matrixDisk)
	return ok && n >= last+2
}

func readOrEmpty(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func modeString(modes []v1alpha1.MigrationMode) string {
	s := make([]string, len(modes))
	for i, m := range modes {
		s[i] = string(m)
	}
	return strings.Join(s, "→")
}

// matrixResults gathers the outcomes of every run, for the table at the end.
type matrixResults struct {
	mu   sync.Mutex
	runs map[matrixKey][]outcome
	keys []matrixKey
}

type matrixKey struct {
	cell   matrixCell
	policy string
}

var matrix = &matrixResults{runs: map[matrixKey][]outcome{}}

func (r *matrixResults) add(cell matrixCell, policy string, o outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := matrixKey{cell, policy}
	if _, ok := r.runs[k]; !ok {
		r.keys = append(r.keys, k)
	}
	r.runs[k] = append(r.runs[k], o)
}

// print writes the matrix as a Markdown table: per cell and grace, each policy's outcome (KubeVirt's
// judged against the same grace) and the physical bound.
func (r *matrixResults) print(w io.Writer) {
	if len(r.keys) == 0 {
		return
	}
	fmt.Fprintln(w, "| memory | dirty rate asked / estimated / seen | grace | bound | policy | in time | total | downtime seen by the guest at the switch: median / worst | paused: floor, the stop ÷ floor per paused run | libvirt's downtime | longest stall: median / worst | modes | guest after |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, k := range r.keys {
		if k.policy != policyLifeboat {
			continue
		}
		base := k.cell
		base.grace = 0
		runs := map[string][]outcome{}
		var all []outcome
		for _, p := range matrixPolicies {
			c := k.cell
			if slices.Contains(kubevirtPolicies, p) {
				c = base
			}
			runs[p] = r.runs[matrixKey{c, p}]
			all = append(all, runs[p]...)
		}
		bound := k.cell.bound()
		seen := slices.Max(collect(all, func(o outcome) uint64 { return o.maxDirty }))
		estimates := collect(slices.DeleteFunc(slices.Clone(all), func(o outcome) bool { return !o.estimated }), func(o outcome) uint64 { return o.estimate })
		estimate := "–"
		if len(estimates) > 0 {
			slices.Sort(estimates)
			estimate = fmt.Sprint(estimates[len(estimates)/2] / mib)
		}
		for _, p := range matrixPolicies {
			o := runs[p]
			if len(o) == 0 {
				continue
			}
			fmt.Fprintf(w, "| %s | %s = %d / %s / %d MiB/s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				k.cell.guestString(all), k.cell.factor, k.cell.dirtyRate/mib, estimate, seen/mib, k.cell.grace, fits(bound, k.cell.grace), p,
				inTime(o, k.cell.grace), medianTotal(o), guestStalls(o, outcome.switchStall), pausedAgainstFloor(o, k.cell.floor()), medianDowntime(o),
				guestStalls(o, outcome.anyStall), modeSet(o), guestSet(o))
		}
	}
}

// charts draws the matrix (deadline-matrix.svg) and, for each cell and policy, its last run's
// timeline (deadline-timelines/) into dir.
func (r *matrixResults) charts(dir string) error {
	var cells []chart.MatrixCell
	for _, k := range r.keys {
		if k.policy != policyLifeboat {
			continue
		}
		base := k.cell
		base.grace = 0
		for _, p := range matrixPolicies {
			c := k.cell
			if slices.Contains(kubevirtPolicies, p) {
				c = base
			}
			runs := r.runs[matrixKey{c, p}]
			if len(runs) == 0 {
				continue
			}
			cell := chart.MatrixCell{Row: fmt.Sprintf("%d MiB %s, %s", k.cell.memory/mib, k.cell.factor, k.cell.grace), Policy: p, Runs: len(runs)}
			if k.cell.workingSet > 0 {
				cell.Row = fmt.Sprintf("%d MiB rewriting %d MiB %s, %s", k.cell.memory/mib, k.cell.workingSet/mib, k.cell.factor, k.cell.grace)
			}
			if k.cell.diskRate > 0 {
				cell.Row = fmt.Sprintf("%d MiB, disk %s, %s", k.cell.memory/mib, k.cell.diskFactor, k.cell.grace)
			}
			for _, o := range runs {
				if o.inTime(k.cell.grace) {
					cell.InTime++
				}
			}
			if done := collect(slices.DeleteFunc(slices.Clone(runs), func(o outcome) bool { return !o.finished }), outcome.switchStall); len(done) > 0 {
				cell.Stop, cell.Finished = median(done), true
			}
			cells = append(cells, cell)
		}
	}
	if len(cells) > 0 {
		if err := chart.WriteFile(dir, "deadline-matrix.svg", func(w io.Writer) error {
			return chart.Matrix(w, "Deadline matrix: runs in time and the guest's stop at the switch (median)", cells)
		}); err != nil {
			return err
		}
	}
	for _, k := range r.keys {
		runs := r.runs[k]
		t := runs[len(runs)-1].timeline
		name := fmt.Sprintf("mem=%dMi,dirty=%s", k.cell.memory/mib, k.cell.factor)
		if k.cell.workingSet > 0 {
			name = fmt.Sprintf("mem=%dMi,ws=%dMi,dirty=%s", k.cell.memory/mib, k.cell.workingSet/mib, k.cell.factor)
		}
		if k.cell.diskRate > 0 {
			name += ",disk=" + k.cell.diskFactor
		}
		if k.cell.grace > 0 {
			name += ",grace=" + k.cell.grace.String()
		}
		name += ",policy=" + k.policy
		t.Title = "A migration of the deadline matrix: " + name
		if err := chart.WriteFile(filepath.Join(dir, "deadline-timelines"), name+".svg", func(w io.Writer) error { return chart.MigrationTimeline(w, t) }); err != nil {
			return err
		}
	}
	return nil
}

func (o outcome) switchStall() time.Duration { return o.guestDowntime }

// paused reports whether the policy paused the guest to end the migration.
func (o outcome) paused() bool { return slices.Contains(o.modes, v1alpha1.MigrationModePaused) }

// pausedAgainstFloor is the floor of a paused cell and each paused run's stop against it, in
// the order they ran; "–" where no run that finished was paused.
func pausedAgainstFloor(runs []outcome, floor time.Duration) string {
	var ratios []string
	for _, o := range runs {
		if o.finished && o.paused() {
			ratios = append(ratios, fmt.Sprintf("%.2f ×", o.guestDowntime.Seconds()/floor.Seconds()))
		}
	}
	if len(ratios) == 0 {
		return "–"
	}
	return fmt.Sprintf("%s: %s", floor.Round(10*time.Millisecond), strings.Join(ratios, ", "))
}
func (o outcome) anyStall() time.Duration { return o.longestStall }

// guestStalls are the median and worst of a stall the guest saw, over the runs that finished.
func guestStalls(runs []outcome, stall func(outcome) time.Duration) string {
	done := collect(slices.DeleteFunc(slices.Clone(runs), func(o outcome) bool { return !o.finished }), stall)
	if len(done) == 0 {
		return "–"
	}
	return fmt.Sprintf("%s / %s", median(done).Round(10*time.Millisecond), slices.Max(done).Round(10*time.Millisecond))
}

func collect[T any](runs []outcome, f func(outcome) T) []T {
	out := make([]T, len(runs))
	for i, o := range runs {
		out[i] = f(o)
	}
	return out
}

func fits(bound, grace time.Duration) string {
	if bound <= grace {
		return fmt.Sprintf("%s (fits)", bound)
	}
	return fmt.Sprintf("%s (does not fit)", bound)
}

// inTime counts the runs that ended with the guest on the destination before the deadline.
func inTime(runs []outcome, grace time.Duration) string {
	n := 0
	for _, o := range runs {
		if o.inTime(grace) {
			n++
		}
	}
	return fmt.Sprintf("%d/%d", n, len(runs))
}

// inTime reports whether the guest arrived on the destination within grace.
func (o outcome) inTime(grace time.Duration) bool { return o.finished && o.total <= grace }

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// medianTotal is the median time of the runs that finished, or how long the unfinished ran.
func medianTotal(runs []outcome) string {
	if len(runs) == 0 {
		return "–"
	}
	done := collect(slices.DeleteFunc(slices.Clone(runs), func(o outcome) bool { return !o.finished }), func(o outcome) time.Duration { return o.total })
	if len(done) == 0 {
		return fmt.Sprintf("aborted at %s", median(collect(runs, func(o outcome) time.Duration { return o.total })).Round(100*time.Millisecond))
	}
	return median(done).Round(100 * time.Millisecond).String()
}

func medianDowntime(runs []outcome) string {
	done := collect(slices.DeleteFunc(slices.Clone(runs), func(o outcome) bool { return !o.finished }), func(o outcome) time.Duration { return o.downtime })
	if len(done) == 0 {
		return "–"
	}
	return median(done).Round(time.Millisecond).String()
}

func modeSet(runs []outcome) string {
	return strings.Join(uniq(collect(runs, func(o outcome) string { return modeString(o.modes) })), ", ")
}

func guestSet(runs []outcome) string {
	return strings.Join(uniq(collect(runs, func(o outcome) string { return o.guestAfterward })), ", ")
}

func uniq(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
