package bench

import (
	"os"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
)

// BenchmarkDiskMirrorMode migrates the deadline matrix's disk-writing guests (issue 19) with
// lifeboat's policy twice, once with the synchronous mirror lifeboat uses (QEMU's write-blocking
// mode: a guest write completes when both nodes have it) and once with QEMU's background copy,
// KubeVirt's, and reports the guest's stop at the switch-over, its longest stall anywhere, and
// whether the migration ended within the grace. It tells whether the synchronous mirror is what
// stalls a guest that writes slower than the copy moves, and what the background copy costs one
// that writes faster. Each iteration boots a fresh guest on a fresh pair; compare the modes with
// benchstat over several runs (make bench-mirror).
func BenchmarkDiskMirrorMode(b *testing.B) {
	img, err := guest.Ensure(b.Context(), os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	const grace = 30 * time.Second
	for _, f := range diskFactors {
		cell := matrixCell{memory: diskMemory, factor: dirtyFactors[0].name, diskRate: matrixCap * f.num / f.den, diskFactor: f.name, grace: grace}
		for _, mode := range []struct {
			name        string
			synchronous bool
		}{{"synchronous", true}, {"background", false}} {
			b.Run("disk="+f.name+"/mirror="+mode.name, func(b *testing.B) {
				for b.Loop() {
					o := migrateOnce(b, img, cell, func(c *agent.ConvergingMigration, start time.Time, stats func() domain.JobStats) {
						lifeboatPolicy(grace, false)(c, start, stats)
						c.Options.SynchronousDiskWrites = mode.synchronous
						// Past the grace the kubelet would have killed the VM: a migration
						// still running then has failed, and is aborted.
						c.Cancelled = func() bool { return time.Since(start) >= grace }
					})
					inTime := 0.0
					if o.inTime(grace) {
						inTime = 1
					}
					b.ReportMetric(inTime, "in-time")
					if !o.finished {
						continue
					}
					expectArrivedWhole(b, o.guestAfterward, cell)
					b.ReportMetric(float64(o.guestDowntime.Milliseconds()), "ms-guest-downtime")
					b.ReportMetric(float64(o.longestStall.Milliseconds()), "ms-longest-stall")
					b.ReportMetric(o.total.Seconds(), "s-total")
				}
			})
		}
	}
}
