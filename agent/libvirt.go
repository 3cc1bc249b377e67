package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// libvirtConn is a DomainConn over a launcher's libvirt socket, through a relay the agent can cut.
type libvirtConn struct {
	conn    *domain.Conn
	socket  *podsocket.Socket
	relay   *libvirtRelay
	changes chan struct{}
	// switchOvers holds a value once one of the connection's domains paused for a
	// migration's switch-over (SwitchOverBegan).
	switchOvers chan struct{}
	cancel      context.CancelFunc
}

// LibvirtDialer connects to launchers' libvirt and follows their lifecycle events. A launcher's
// socket is a file in its pod; it is opened as it is, never through a symlink (podsocket), and
// held open while the connection lasts, as libvirt connects to it again for migrations. libvirt's
// client reaches it through a relay whose socket is in a directory under relayDir (libvirtRelay):
// a connection that does not open by ctx's end, or that the agent gives up on (guardedConn), is
// cut there, and its calls fail at once instead of waiting for a launcher that does not answer.
func LibvirtDialer(relayDir string) Dialer {
	return func(ctx context.Context, socketPath, _ string) (DomainConn, error) {
		socket, err := podsocket.Open(socketPath)
		if err != nil {
			return nil, err
		}
		session, err := domain.SessionSocket(socket.Path())
		if err != nil {
			socket.Close()
			return nil, err
		}
		relay, err := newLibvirtRelay(relayDir, socket)
		if err != nil {
			socket.Close()
			return nil, err
		}
		type result struct {
			c   *libvirtConn
			err error
		}
		done := make(chan result, 1)
		go func() {
			c, err := openLibvirt(relay, session)
			done <- result{c, err}
		}()
		select {
		case r := <-done:
			if r.err != nil {
				relay.Cut()
				socket.Close()
				return nil, r.err
			}
			r.c.socket = socket
			return r.c, nil
		case <-ctx.Done():
			// The launcher's daemon took the connection and has not answered: the cut fails the
			// open, and what it opened meanwhile is closed.
			relay.Cut()
			go func() {
				if r := <-done; r.err == nil {
					_ = r.c.conn.Close()
					r.c.cancel()
				}
				socket.Close()
			}()
			return nil, fmt.Errorf("connecting to the launcher's libvirt at %s: %w", socketPath, ctx.Err())
		}
	}
}

// openLibvirt opens a connection through relay and follows its domains' lifecycle events.
func openLibvirt(relay *libvirtRelay, session bool) (*libvirtConn, error) {
	conn, err := domain.ConnectSocket(relay.Path(), session)
	if err != nil {
		return nil, err
	}
	evCtx, cancel := context.WithCancel(context.Background())
	events, err := conn.Events(evCtx)
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	c := &libvirtConn{conn: conn, relay: relay, changes: make(chan struct{}, 1), switchOvers: make(chan struct{}, 1), cancel: cancel}
	go func() {
		defer close(c.changes)
		for ev := range events {
			if SwitchOverBegan(ev) {
				select {
				case c.switchOvers <- struct{}{}:
				default:
				}
			}
			select {
			case c.changes <- struct{}{}:
			default: // a change is already pending; one look covers both
			}
		}
	}()
	return c, nil
}

func (c *libvirtConn) Changes() <-chan struct{} { return c.changes }

// SwitchOvers holds a value once a domain of the connection paused for a migration's
// switch-over; a value left from an earlier migration is to be drained before the next.
func (c *libvirtConn) SwitchOvers() <-chan struct{} { return c.switchOvers }

func (c *libvirtConn) Observe(_ context.Context, name string) (*Domain, error) {
	info, err := c.conn.Lookup(name)
	if errors.Is(err, domain.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := &Domain{State: stateOf(info.State, info.Reason)}
	md, err := c.conn.Metadata(name)
	if err != nil {
		return nil, fmt.Errorf("reading lifeboat's metadata of %s: %w", name, err)
	}
	if gs := md.GracefulShutdown; gs != nil {
		signal, deadline := gs.SignalTime, gs.Deadline
		d.GracefulShutdown, d.PodDeadline = &signal, &deadline
	}
	return d, nil
}

// stateOf maps libvirt's view to the agent's: a domain that stopped because it crashed
// (on_crash=destroy) is a crash, not a power-off.
func stateOf(s domain.State, r domain.Reason) DomainState {
	switch {
	case s == domain.Running:
		return DomainRunning
	case s == domain.Paused:
		return DomainPaused
	case s == domain.PMSuspended:
		return DomainPMSuspended
	case s == domain.ShuttingDown:
		return DomainShuttingDown
	case s == domain.Crashed, s == domain.Shutoff && r == domain.ReasonCrashed:
		return DomainCrashed
	default:
		return DomainShutoff
	}
}

func (c *libvirtConn) Shutdown(_ context.Context, name string) error { return c.conn.Shutdown(name) }
func (c *libvirtConn) Destroy(_ context.Context, name string) error  { return c.conn.Destroy(name) }
func (c *libvirtConn) DomainNames(context.Context) ([]string, error) { return c.conn.DomainNames() }

// Cut ends the connection's stream to the launcher: every call waiting on it fails at once, and
// so does every later one. Close still releases the connection.
func (c *libvirtConn) Cut() { c.relay.Cut() }

// Close cuts the connection first: libvirt's client says goodbye to the daemon on close, and a
// daemon that does not answer would hold that too.
func (c *libvirtConn) Close() error {
	c.relay.Cut()
	c.cancel()
	err := c.conn.Close()
	c.socket.Close()
	return err
}

func (c *libvirtConn) Migrate(ctx context.Context, name string, opts domain.MigrateOptions) error {
	return c.conn.Migrate(ctx, name, opts)
}
func (c *libvirtConn) JobStats(name string) (domain.JobStats, error) { return c.conn.JobStats(name) }
func (c *libvirtConn) StartPostCopy(name string) error               { return c.conn.StartPostCopy(name) }
func (c *libvirtConn) Suspend(name string) error                     { return c.conn.Suspend(name) }
func (c *libvirtConn) Resume(name string) error                      { return c.conn.Resume(name) }
func (c *libvirtConn) LoadQEMUCapabilities() error                   { return c.conn.LoadQEMUCapabilities() }
func (c *libvirtConn) Session() bool                                 { return c.conn.Session() }
func (c *libvirtConn) State(name string) (domain.State, domain.Reason, error) {
	return c.conn.State(name)
}
func (c *libvirtConn) StartDirtyRateCalc(name string, period time.Duration, mode domain.DirtyRateMode) error {
	return c.conn.StartDirtyRateCalc(name, period, mode)
}
func (c *libvirtConn) DirtyRate(name string) (uint64, bool, error) { return c.conn.DirtyRate(name) }

// The agent finds a launcher's Migrator by asserting its DomainConn: a method missing here would
// leave every migration without a source, which only this line makes a compile error.
var _ Migrator = (*libvirtConn)(nil)
