package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// libvirtConn is a DomainConn over a launcher's libvirt socket.
type libvirtConn struct {
	conn    *domain.Conn
	socket  *podsocket.Socket
	changes chan struct{}
	cancel  context.CancelFunc
}

// DialLibvirt connects to a launcher's libvirt and follows its lifecycle events. The socket is
// a file in the launcher's pod; it is dialled as it is, never through a symlink (podsocket),
// and held open while the connection lasts, as libvirt connects to it again for migrations.
func DialLibvirt(ctx context.Context, socketPath, _ string) (DomainConn, error) {
	socket, err := podsocket.Open(socketPath)
	if err != nil {
		return nil, err
	}
	conn, err := domain.Connect(socket.Path())
	if err != nil {
		socket.Close()
		return nil, err
	}
	evCtx, cancel := context.WithCancel(context.Background())
	events, err := conn.Events(evCtx)
	if err != nil {
		cancel()
		conn.Close()
		socket.Close()
		return nil, err
	}
	c := &libvirtConn{conn: conn, socket: socket, changes: make(chan struct{}, 1), cancel: cancel}
	go func() {
		defer close(c.changes)
		for range events {
			select {
			case c.changes <- struct{}{}:
			default: // a change is already pending; one look covers both
			}
		}
	}()
	return c, nil
}

func (c *libvirtConn) Changes() <-chan struct{} { return c.changes }

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

func (c *libvirtConn) Close() error {
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
