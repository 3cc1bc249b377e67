package bench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
)

// BenchmarkDowntimeTarget migrates guests whose pre-copy fits their grace (60 s) with lifeboat's
// policy twice, once with QEMU's own downtime target (300 ms) and once with lifeboat's
// (agent.MaxDowntime), and reports the downtime the guest saw and libvirt's: the guest stands
// still for QEMU's downtime and then until the destination's libvirt has it run, so a target of
// 300 ms lets the guest see more. Run it a few times (make bench-downtime) and compare the targets
// with benchstat; each iteration boots a fresh guest on a fresh pair.
func BenchmarkDowntimeTarget(b *testing.B) {
	img, err := guest.Ensure(b.Context(), os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	const grace = 60 * time.Second
	cells := []matrixCell{
		{memory: 1024 * mib, factor: "0", grace: grace},
		{memory: 256 * mib, dirtyRate: matrixCap / 2, factor: "0.5x", grace: grace},
		// The matrix's guest that writes its disk at 1½ the cap: the disk's switch-over is not in
		// QEMU's downtime.
		{memory: diskMemory, factor: "0", diskRate: matrixCap * 3 / 2, diskFactor: "1.5x", grace: grace},
	}
	for _, cell := range cells {
		name := fmt.Sprintf("mem=%dMi/dirty=%s", cell.memory/mib, cell.factor)
		if cell.diskRate > 0 {
			name += "/disk=" + cell.diskFactor
		}
		for _, target := range []struct {
			name string
			max  time.Duration
		}{{"qemu", 0}, {"lifeboat", agent.MaxDowntime}} {
			b.Run(name+"/target="+target.name, func(b *testing.B) {
				for b.Loop() {
					o := migrateOnce(b, img, cell, func(c *agent.ConvergingMigration, start time.Time, stats func() domain.JobStats) {
						lifeboatPolicy(grace, false)(c, start, stats)
						c.Options.MaxDowntime = target.max
					})
					if !o.finished {
						b.Fatalf("the migration did not finish")
					}
					expectArrivedWhole(b, o.guestAfterward, cell)
					b.ReportMetric(float64(o.guestDowntime.Milliseconds()), "ms-guest-downtime")
					b.ReportMetric(float64(o.downtime.Milliseconds()), "ms-libvirt-downtime")
				}
			})
		}
	}
}
