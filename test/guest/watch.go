package guest

import (
	"context"
	"os"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// watchPoll is how often WatchCounters reads the consoles: the precision of what it sees.
const watchPoll = 5 * time.Millisecond

// Stall is what WatchCounters saw of the guest's counter standing still beyond its tick.
type Stall struct {
	// Longest is the longest it stood still, on whichever console, and Ended when it moved again.
	Longest time.Duration
	Ended   time.Time
	// Switch is how long it stood still across a move: from the last counter one console showed
	// to the first one another console showed, the stop a migration's switch-over makes. A stall
	// away from the switch (the deadline matrix's disk writers have them before and after it) is
	// in Longest but not here. Zero if the counter never moved consoles.
	Switch time.Duration
}

// WatchCounters notes when each of the guest's counters first appears on any of the consoles
// (asked again at every read, so a console that appears later, a migration target's, is
// read too) until the returned function is called; that returns how long the counter stood
// still beyond its tick (Stall). The guest's clock stops while the guest is paused or switches
// nodes, so that is how long an observer saw the guest stopped, to the polling and the guest's timer.
func WatchCounters(ctx context.Context, tick time.Duration, consoles func() []string) (stop func() Stall) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan Stall, 1)
	go func() {
		last, lastAt, lastFrom, worst := 0, time.Time{}, "", Stall{}
		t := time.NewTicker(watchPoll)
		defer t.Stop()
		for {
			now := time.Now()
			n, from := 0, ""
			for _, c := range consoles() {
				if b, err := os.ReadFile(c); err == nil {
					if k, ok := protocol.LastCounter(string(b)); ok && k > n {
						n, from = k, c
					}
				}
			}
			if n > last {
				if stood := now.Sub(lastAt) - time.Duration(n-last)*tick; last > 0 {
					if stood > worst.Longest {
						worst.Longest, worst.Ended = stood, now
					}
					if from != lastFrom {
						worst.Switch = max(worst.Switch, stood)
					}
				}
				last, lastAt, lastFrom = n, now, from
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
