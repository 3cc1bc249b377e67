package agent

import "time"

// Each connection to a launcher's libvirt starts a child of its own (libvirtclient): a fork and
// exec of the agent's binary in four new namespaces. A launcher, which its tenant may exec into,
// can make connections fail at once, or end just after they open, as fast as it recreates its
// socket; without a bound each would start another child, on the agent's CPU share and the
// node's namespace locks. So connections to one launcher that fail, or end within
// shortConnection of opening, space the next ones out (DialDelay); one that lasted clears that.
const (
	// shortConnection: a connection that ends sooner counts as a failure.
	shortConnection = 10 * time.Second
	// firstDialDelay is the delay after the first failure: a launcher restarting its libvirtd
	// (at most five times in ten minutes, the first after half a second) waits about that long.
	firstDialDelay = 500 * time.Millisecond
	// dialFailuresEvent is the run of failures after which the VMI gets a Warning Event.
	dialFailuresEvent = 3
)

// DialDelay is how long the agent waits before it connects again to a launcher whose last
// failures connections in a row failed or ended early: none after no failure, then
// firstDialDelay doubling up to maxReconnectAfterStall.
func DialDelay(failures int) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := firstDialDelay
	for i := 1; i < failures && d < maxReconnectAfterStall; i++ {
		d *= 2
	}
	return min(d, maxReconnectAfterStall)
}

// dialGate is what the agent remembers of a launcher's recent connections.
type dialGate struct {
	failures  int
	notBefore time.Time
	// scheduled: a connect is already set for notBefore.
	scheduled bool
}
