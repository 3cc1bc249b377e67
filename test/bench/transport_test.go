package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/migrationpair"
)

// BenchmarkMigrationTransport migrates the same guest (256 MiB, 160 MiB of it filled with
// non-zero pages, then idle) between two real libvirt daemons through the agents' proxies, in plain TCP (what
// the proxies spoke before they authenticated each other) and in TLS 1.3 with both nodes' certificates checked (what agents
// do), uncapped (lifeboat's default) and capped as the deadline matrix is (matrixCap, 64 MiB/s), interleaved in one run: compare the
// transports with benchstat. Each iteration boots a fresh guest on a fresh pair, untimed.
func BenchmarkMigrationTransport(b *testing.B) {
	img, err := guest.Ensure(b.Context(), os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	for _, bandwidth := range []struct {
		name  string
		bytes uint64
	}{{"cap=none", 0}, {"cap=64MiB", matrixCap}} {
		for _, transport := range []migrationpair.Transport{migrationpair.PlainTCP, migrationpair.TLS} {
			b.Run(bandwidth.name+"/transport="+string(transport), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					p := migrationpair.NewWith(b, transport)
					ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
					cell := matrixCell{memory: 256 * mib}
					name := p.RunGuest(b, ctx, matrixGuest(img, cell), domain.TCG)
					b.StartTimer()
					start := time.Now()
					err := p.Src.Conn.Migrate(ctx, name, p.Options(bandwidth.bytes))
					elapsed := time.Since(start)
					b.StopTimer()
					if err != nil {
						cancel()
						b.Fatalf("migrating over %s: %v", transport, err)
					}
					b.ReportMetric(elapsed.Seconds(), "s/migration")
					if s, err := p.Dst.Conn.CompletedJobStats(name); err == nil {
						b.ReportMetric(float64(s.Downtime.Milliseconds()), "ms-downtime")
					}
					expectArrivedWhole(b, guestAfterward(ctx, p, cell), cell)
					cancel()
				}
			})
		}
	}
}
