package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lifeboat-vm/lifeboat/domain"
)

// Deadlines of the agent's calls to a launcher's libvirt (issue 45, N5). A launcher's libvirtd is
// the tenant's to replace, and libvirt's client waits for a reply for as long as the daemon keeps
// the connection alive: without a deadline, a launcher that takes calls and never answers them
// would hold the agent's workers, and with them every other VM's evacuation on the node. The rule
// is one deadline per kind of call, far above what a healthy daemon takes:
//
//   - libvirtCallDeadline for the calls that take no lock of the domain's jobs (look-up, state,
//     metadata): a healthy daemon answers them in milliseconds;
//   - libvirtJobDeadline for every other call on a domain (job statistics, dirty rate, shutdown,
//     destroy, suspend, resume, post-copy, starting a dirty-rate sample): those may wait for the
//     domain's job lock, which libvirt itself gives up on after 30 s with an error of its own, so
//     a healthy daemon busy with another job still answers first;
//   - libvirtCapabilitiesDeadline for loading QEMU's capabilities, a probe of QEMU that takes
//     seconds on a node's first launcher (about 4 s under TCG);
//   - a connection must open within connect's 30 s (LibvirtDialer honours its context);
//   - a migration has no deadline of its own here: it waits on a connection of its own, and
//     its context (the migration's) aborts it.
//
// The workers' calls to one launcher take turns: a call waits at most launcherTurnWait for the one
// before it, then fails (the caller retries later), so one launcher holds one worker at most. A
// migration's own loop, on a goroutine of its own, takes no turn (withoutTurns): it neither waits
// behind a worker's call that waits for the domain's job lock nor holds a worker up. A call past its
// deadline is abandoned: the worker stops waiting, the connection is cut (libvirtRelay, which ends
// the abandoned call too) and never used again, the abandonment is counted
// (lifeboat_agent_libvirt_calls_abandoned_total), logged and recorded as an Event on the VMI, and
// the agent reconnects after reconnectAfterStall, twice as long after each further stall.
const (
	libvirtCallDeadline         = 10 * time.Second
	libvirtJobDeadline          = 45 * time.Second
	libvirtCapabilitiesDeadline = 2 * time.Minute
	launcherTurnWait            = time.Second
	reconnectAfterStall         = 30 * time.Second
	maxReconnectAfterStall      = 5 * time.Minute
	// guardCloseWait is how long closing a connection waits for its calls to end once cut, before
	// it leaves libvirt's connection open rather than free it under a call.
	guardCloseWait = 10 * time.Second
)

// ReasonLauncherStalled is the Warning Event on a VMI whose launcher's libvirt did not answer a
// call in time.
const ReasonLauncherStalled = "LauncherLibvirtStalled"

var (
	// errLauncherStalled: a call to the launcher passed its deadline; its connection is cut.
	errLauncherStalled = errors.New("the launcher's libvirt did not answer in time; its connection is cut")
	// errLauncherBusy: another call to the launcher has not ended yet.
	errLauncherBusy = errors.New("the launcher's libvirt is still busy with another call")
)

// cutter is a DomainConn that can end its stream at once (libvirtConn).
type cutter interface{ Cut() }

// guardedConn gives every call to a launcher's connection its deadline and, unless it is a
// migration loop's view (withoutTurns), its turn (see above).
type guardedConn struct {
	*guard
	takesTurns bool
}

// guard is what a connection's views share.
type guard struct {
	inner DomainConn
	mg    Migrator // inner as a Migrator; nil if it is not one
	// onStall is told once, when the first call passes its deadline.
	onStall func(call string, deadline time.Duration)

	turn      chan struct{} // holds a value while a call runs
	stalled   chan struct{} // closed once a call passed its deadline
	stallOnce sync.Once
	closed    chan struct{}
	closeOnce sync.Once
	changes   chan struct{}
	calls     sync.WaitGroup
}

func newGuardedConn(inner DomainConn, onStall func(call string, deadline time.Duration)) *guardedConn {
	g := &guardedConn{guard: &guard{inner: inner, onStall: onStall, turn: make(chan struct{}, 1), stalled: make(chan struct{}),
		closed: make(chan struct{}), changes: make(chan struct{}, 1)}, takesTurns: true}
	g.mg, _ = inner.(Migrator)
	go g.forwardChanges()
	return g
}

// withoutTurns is the view of g for a migration's own loop: the same deadlines, no turns.
func (g *guardedConn) withoutTurns() *guardedConn { return &guardedConn{guard: g.guard} }

// loopMigrator is mg as a migration's own loop uses it (withoutTurns).
func loopMigrator(mg Migrator) Migrator {
	if g, ok := mg.(*guardedConn); ok {
		return g.withoutTurns()
	}
	return mg
}

// forwardChanges passes the connection's changes on until it ends, stalls or is closed.
func (g *guard) forwardChanges() {
	defer close(g.changes)
	in := g.inner.Changes()
	for {
		select {
		case _, ok := <-in:
			if !ok {
				return
			}
			select {
			case g.changes <- struct{}{}:
			default:
			}
		case <-g.stalled:
			return
		case <-g.closed:
			return
		}
	}
}

// hasStalled reports whether a call passed its deadline.
func (g *guard) hasStalled() bool {
	select {
	case <-g.stalled:
		return true
	default:
		return false
	}
}

// guarded runs f, the call named call, in its turn and within deadline.
func guarded[T any](ctx context.Context, g *guardedConn, call string, deadline time.Duration, f func() (T, error)) (T, error) {
	var zero T
	if g.hasStalled() {
		return zero, fmt.Errorf("%s: %w", call, errLauncherStalled)
	}
	if g.takesTurns {
		wait := time.NewTimer(min(launcherTurnWait, deadline))
		defer wait.Stop()
		select {
		case g.turn <- struct{}{}:
		case <-g.stalled:
			return zero, fmt.Errorf("%s: %w", call, errLauncherStalled)
		case <-wait.C:
			return zero, fmt.Errorf("%s: %w", call, errLauncherBusy)
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	g.calls.Add(1)
	go func() {
		defer g.calls.Done()
		// The turn is the call's until it has really ended, abandoned or not.
		if g.takesTurns {
			defer func() { <-g.turn }()
		}
		v, err := f()
		done <- result{v, err}
	}()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-timer.C:
		g.stall(call, deadline)
		return zero, fmt.Errorf("%s after %s: %w", call, deadline, errLauncherStalled)
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// stall gives up on the connection: it is cut, which ends the call that stalled, and so are the
// calls and changes after it.
func (g *guard) stall(call string, deadline time.Duration) {
	g.stallOnce.Do(func() {
		close(g.stalled)
		if c, ok := g.inner.(cutter); ok {
			c.Cut()
		}
		if g.onStall != nil {
			g.onStall(call, deadline)
		}
	})
}

func (g *guardedConn) Changes() <-chan struct{} { return g.changes }

func (g *guardedConn) Observe(ctx context.Context, name string) (*Domain, error) {
	return guarded(ctx, g, "observe", libvirtCallDeadline, func() (*Domain, error) { return g.inner.Observe(ctx, name) })
}

func (g *guardedConn) Shutdown(ctx context.Context, name string) error {
	_, err := guarded(ctx, g, "shutdown", libvirtJobDeadline, func() (struct{}, error) { return struct{}{}, g.inner.Shutdown(ctx, name) })
	return err
}

func (g *guardedConn) Destroy(ctx context.Context, name string) error {
	_, err := guarded(ctx, g, "destroy", libvirtJobDeadline, func() (struct{}, error) { return struct{}{}, g.inner.Destroy(ctx, name) })
	return err
}

func (g *guardedConn) DomainNames(ctx context.Context) ([]string, error) {
	return guarded(ctx, g, "domain-names", libvirtCallDeadline, func() ([]string, error) { return g.inner.DomainNames(ctx) })
}

// Close cuts the connection, waits a while for its calls to end, and closes it; a call that still
// has not ended keeps it open rather than have libvirt free it under the call.
func (g *guardedConn) Close() error {
	g.closeOnce.Do(func() { close(g.closed) })
	if c, ok := g.inner.(cutter); ok {
		c.Cut()
	}
	ended := make(chan struct{})
	go func() { g.calls.Wait(); close(ended) }()
	select {
	case <-ended:
		return g.inner.Close()
	case <-time.After(guardCloseWait):
		return errors.New("a call to the launcher's libvirt has not ended: its connection is left open")
	}
}

// migrator is g as a Migrator if its connection is one; nil otherwise.
// SwitchOvers is the inner connection's, nil if it has none.
func (g *guardedConn) SwitchOvers() <-chan struct{} {
	if s, ok := g.inner.(switchOverer); ok {
		return s.SwitchOvers()
	}
	return nil
}

func (g *guardedConn) migrator() Migrator {
	if g.mg == nil {
		return nil
	}
	return g
}

// call runs a Migrator call that returns only an error.
func (g *guardedConn) call(name string, deadline time.Duration, f func() error) error {
	_, err := guarded(context.Background(), g, name, deadline, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// Migrate is not given a deadline: it waits on a connection of its own, and ctx (the migration's)
// aborts it.
func (g *guardedConn) Migrate(ctx context.Context, name string, opts domain.MigrateOptions) error {
	if g.hasStalled() {
		return fmt.Errorf("migrate: %w", errLauncherStalled)
	}
	return g.mg.Migrate(ctx, name, opts)
}

func (g *guardedConn) JobStats(name string) (domain.JobStats, error) {
	return guarded(context.Background(), g, "job-stats", libvirtJobDeadline, func() (domain.JobStats, error) { return g.mg.JobStats(name) })
}

func (g *guardedConn) StartDirtyRateCalc(name string, period time.Duration, mode domain.DirtyRateMode) error {
	return g.call("start-dirty-rate", libvirtJobDeadline, func() error { return g.mg.StartDirtyRateCalc(name, period, mode) })
}

func (g *guardedConn) DirtyRate(name string) (uint64, bool, error) {
	type rate struct {
		v  uint64
		ok bool
	}
	r, err := guarded(context.Background(), g, "dirty-rate", libvirtJobDeadline, func() (rate, error) {
		v, ok, err := g.mg.DirtyRate(name)
		return rate{v, ok}, err
	})
	return r.v, r.ok, err
}

func (g *guardedConn) StartPostCopy(name string) error {
	return g.call("start-post-copy", libvirtJobDeadline, func() error { return g.mg.StartPostCopy(name) })
}

func (g *guardedConn) State(name string) (domain.State, domain.Reason, error) {
	type state struct {
		s domain.State
		r domain.Reason
	}
	st, err := guarded(context.Background(), g, "state", libvirtCallDeadline, func() (state, error) {
		s, r, err := g.mg.State(name)
		return state{s, r}, err
	})
	if err != nil {
		return domain.NoState, domain.ReasonUnknown, err
	}
	return st.s, st.r, nil
}

func (g *guardedConn) Suspend(name string) error {
	return g.call("suspend", libvirtJobDeadline, func() error { return g.mg.Suspend(name) })
}

func (g *guardedConn) Resume(name string) error {
	return g.call("resume", libvirtJobDeadline, func() error { return g.mg.Resume(name) })
}

func (g *guardedConn) LoadQEMUCapabilities() error {
	return g.call("load-capabilities", libvirtCapabilitiesDeadline, g.mg.LoadQEMUCapabilities)
}

// Session asks nothing of the daemon.
func (g *guardedConn) Session() bool { return g.mg.Session() }

var _ Migrator = (*guardedConn)(nil)
