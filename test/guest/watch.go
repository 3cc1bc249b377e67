package guest

import (
	"context"
	"os"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// watchPoll is how often WatchCounters reads the consoles: the precision of what it sees.
const watchPoll = 5 * time.Millisecond

// Stall is the longest the guest's counter stood still beyond its tick, and when it moved again.
type Stall struct {
	Longest time.Duration
	// Ended is when the counter moved again: set against a migration's end, it says whether the
	// stall was the switch-over or came while the guest still ran on its source.
	Ended time.Time
}

// WatchCounters notes when each of the guest's counters first appears on any of the consoles
// (asked again at every read, so a console that appears later, a migration target's, is
// read too) until the returned function is called; that returns the longest the counter stood
// still beyond its tick. The guest's clock stops while the guest is paused or switches nodes,
// so that is how long an observer saw the guest stopped, to the polling and the guest's timer.
func WatchCounters(ctx context.Context, tick time.Duration, consoles func() []string) (stop func() Stall) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan Stall, 1)
	go func() {
		last, lastAt, worst := 0, time.Time{}, Stall{}
		t := time.NewTicker(watchPoll)
		defer t.Stop()
		for {
			now := time.Now()
			n := 0
			for _, c := range consoles() {
				if b, err := os.ReadFile(c); err == nil {
					if k, ok := protocol.LastCounter(string(b)); ok {
						n = max(n, k)
					}
				}
			}
			if n > last {
				if stood := now.Sub(lastAt) - time.Duration(n-last)*tick; last > 0 && stood > worst.Longest {
					worst = Stall{Longest: stood, Ended: now}
				}
				last, lastAt = n, now
			}
			select {
			case <-ctx.Done():
				done <- worst
				return
			case <-t.C:
			}
		}
	}()
	return func() Stall {
		cancel()
		return <-done
	}
}
