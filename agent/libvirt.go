package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lifeboat-vm/lifeboat/agent/libvirtclient"
	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// libvirtConn is a DomainConn over a launcher's libvirt socket. libvirt's client runs in a
// confined child (libvirtclient), never in the agent, and reaches the launcher through a relay
// the agent can cut.
type libvirtConn struct {
	client  *libvirtclient.Client
	socket  *podsocket.Socket
	relay   *libvirtRelay
	changes chan struct{}
	// switchOvers holds a value once one of the connection's domains paused for a
	// migration's switch-over (SwitchOverBegan).
	switchOvers chan struct{}
}

// listenWait bounds how long a dial waits for a launcher's socket to listen: a daemon listens
// within tens of milliseconds of binding; one that does not by then is retried after DialDelay.
const listenWait = time.Second

// LibvirtDialer connects to launchers' libvirt and follows their lifecycle events. A launcher's
// socket is a file in its pod; it is opened as it is, never through a symlink (podsocket), and
// held open while the connection lasts, as libvirt connects to it again for migrations. libvirt's
// client, in a child of its own per connection whose standard error goes to log, reaches it
// through a relay whose socket is in a directory under relayDir (libvirtRelay): a connection
// that does not open by ctx's end, or that the agent gives up on (guardedConn), is cut there and
// its child killed, and its calls fail at once instead of waiting for a launcher that does not
// answer.
func LibvirtDialer(relayDir string, log *slog.Logger) Dialer {
	return func(ctx context.Context, socketPath, vmiUID string) (DomainConn, error) {
		socket, err := podsocket.Open(socketPath)
		if err != nil {
			return nil, err
		}
		// The agent sees a new launcher's socket as its daemon binds it, often before it listens:
		// a refused dial would wait DialDelay (half a second) on the connect every target's
		// readiness waits for. The wait here is cheap, in process, before any client child starts.
		if err := socket.AwaitListening(ctx, listenWait); err != nil {
			socket.Close()
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
		c := &libvirtConn{socket: socket, relay: relay, changes: make(chan struct{}, 1), switchOvers: make(chan struct{}, 1)}
		client, err := libvirtclient.Start(libvirtclient.Options{Dir: relay.dir, Socket: relaySocket,
			Log: log.With("vmiUID", vmiUID, "socket", socketPath), OnEvent: c.event})
		if err != nil {
			relay.Cut()
			socket.Close()
			return nil, err
		}
		relay.admit(client.Pid())
		c.client = client
		if err := client.Connect(ctx, session); err != nil {
			// A daemon that took the connection and has not answered by ctx's end: the cut fails
			// the open, and the child goes with it.
			c.Close()
			return nil, fmt.Errorf("connecting to the launcher's libvirt at %s: %w", socketPath, err)
		}
		go func() {
			<-client.Done()
			close(c.changes)
		}()
		return c, nil
	}
}

// event takes a lifecycle event from the child: it must not block.
func (c *libvirtConn) event(ev domain.Event) {
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

func (c *libvirtConn) Changes() <-chan struct{} { return c.changes }

// SwitchOvers holds a value once a domain of the connection paused for a migration's
// switch-over; a value left from an earlier migration is to be drained before the next.
func (c *libvirtConn) SwitchOvers() <-chan struct{} { return c.switchOvers }

func (c *libvirtConn) Observe(_ context.Context, name string) (*Domain, error) {
	info, err := c.client.Lookup(name)
	if errors.Is(err, domain.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := &Domain{State: stateOf(info.State, info.Reason), PausedUser: info.State == domain.Paused && info.Reason == domain.ReasonUser}
	md, err := c.client.Metadata(name)
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

func (c *libvirtConn) Shutdown(_ context.Context, name string) error { return c.client.Shutdown(name) }
func (c *libvirtConn) Destroy(_ context.Context, name string) error  { return c.client.Destroy(name) }
func (c *libvirtConn) DomainNames(context.Context) ([]string, error) { return c.client.DomainNames() }

// Cut ends the connection's stream to the launcher and kills its child: every call waiting on it
// fails at once, and so does every later one. Close still releases the connection.
func (c *libvirtConn) Cut() {
	c.relay.Cut()
	c.client.Cut()
}

// Close cuts the connection and waits for its child to exit.
func (c *libvirtConn) Close() error {
	c.relay.Cut()
	err := c.client.Close()
	c.socket.Close()
	return err
}

func (c *libvirtConn) Migrate(ctx context.Context, name string, opts domain.MigrateOptions) error {
	return c.client.Migrate(ctx, name, opts)
}
func (c *libvirtConn) JobStats(name string) (domain.JobStats, error) { return c.client.JobStats(name) }
func (c *libvirtConn) StartPostCopy(name string) error               { return c.client.StartPostCopy(name) }
func (c *libvirtConn) Suspend(name string) error                     { return c.client.Suspend(name) }
func (c *libvirtConn) Resume(name string) error                      { return c.client.Resume(name) }
func (c *libvirtConn) LoadQEMUCapabilities() error                   { return c.client.LoadQEMUCapabilities() }
func (c *libvirtConn) Session() bool                                 { return c.client.Session() }
func (c *libvirtConn) State(name string) (domain.State, domain.Reason, error) {
	return c.client.State(name)
}
func (c *libvirtConn) StartDirtyRateCalc(name string, period time.Duration, mode domain.DirtyRateMode) error {
	return c.client.StartDirtyRateCalc(name, period, mode)
}
func (c *libvirtConn) DirtyRate(name string) (uint64, bool, error) { return c.client.DirtyRate(name) }

// The agent finds a launcher's Migrator by asserting its DomainConn: a method missing here would
// leave every migration without a source, which only this line makes a compile error.
var _ Migrator = (*libvirtConn)(nil)
