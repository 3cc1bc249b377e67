package domain

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// TestDirtyRateEstimateMatchesTheGuest measures, as the agent does at a migration's start
// (page sampling over one second), guests that rewrite their memory at known rates, and
// compares the mean of a few estimates with the rate asked of the guest. Dirty-bitmap mode is
// logged beside it: under TCG on QEMU 10 it reads 0 whatever the guest writes, which is why
// the agent samples pages.
func TestDirtyRateEstimateMatchesTheGuest(t *testing.T) {
	const (
		mib     = 1 << 20
		size    = 128 * mib
		samples = 3
	)
	c := connect(t, startDaemon(t))
	for _, rate := range []uint64{0, 16 * mib, 48 * mib} {
		t.Run(fmt.Sprintf("%dMiB/s", rate/mib), func(t *testing.T) {
			vmi := guestVMI(t, fmt.Sprintf("dirty-%d", rate/mib), fmt.Sprintf("%s=%d", protocol.DirtyParam, size), fmt.Sprintf("%s=%d", protocol.DirtyRateParam, rate))
			vmi.Spec.Memory = resource.MustParse("256Mi")
			name, console := runGuest(t, c, vmi)
			t.Cleanup(func() { _ = c.Destroy(name) })
			ctx := guestContext(t)
			if _, err := guest.WaitForLine(ctx, console, protocol.Dirtying(size, int64(rate))); err != nil {
				t.Fatal(err)
			}
			var sum uint64
			var each []uint64
			for range samples {
				got, err := measureDirtyRate(ctx, c, name, time.Second, DirtyRatePageSampling)
				if err != nil {
					t.Fatal(err)
				}
				sum += got
				each = append(each, got/mib)
			}
			mean := sum / samples
			// Page sampling hashes 128 pages of a 256 MiB guest: a sample scatters by about a
			// third around the rate, the mean of three by a fifth.
			low, high := rate/2, rate*3/2+4*mib
			if mean < low || mean > high {
				t.Errorf("page sampling estimated %d MiB/s (mean of %v) for a guest rewriting %d MiB/s; want %d to %d", mean/mib, each, rate/mib, low/mib, high/mib)
			}
			bitmap, err := measureDirtyRate(ctx, c, name, time.Second, DirtyRateBitmap)
			t.Logf("asked %d MiB/s: page sampling %v MiB/s, dirty bitmap %d MiB/s (%v)", rate/mib, each, bitmap/mib, err)
		})
	}
}

// dirtyRatePoll is how often measureDirtyRate asks whether QEMU's measurement has ended.
const dirtyRatePoll = 50 * time.Millisecond

// measureDirtyRate measures the named domain's dirty rate over period and returns it when
// QEMU's measurement ends, or ctx's error.
func measureDirtyRate(ctx context.Context, c *Conn, name string, period time.Duration, mode DirtyRateMode) (uint64, error) {
	if err := c.StartDirtyRateCalc(name, period, mode); err != nil {
		return 0, err
	}
	// The result cannot be there before the period has passed.
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("measuring the dirty rate of domain %q: %w", name, ctx.Err())
		case <-t.C:
		}
		rate, ok, err := c.DirtyRate(name)
		if err != nil || ok {
			return rate, err
		}
		t.Reset(dirtyRatePoll)
	}
}
