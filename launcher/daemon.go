package launcher

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// The launcher restarts its libvirtd when it dies, up to maxRestarts times in restartWindow,
// each after a backoff doubling from firstRestartDelay; past that it gives up and fails the pod.
// The guest runs in QEMU, which does not need its daemon to run on: a dead libvirtd costs the
// guest nothing as long as one comes back to manage it, while failing the pod would lose it.
const (
	maxRestarts       = 5
	restartWindow     = 10 * time.Minute
	firstRestartDelay = 500 * time.Millisecond
	// restartTimeout bounds one restart, until the new daemon serves connections.
	restartTimeout = time.Minute
	// streamEndGrace is how long a launcher whose event stream ended waits to see whether its
	// daemon exited (the stream ends first, as the connection breaks) or only the connection broke.
	streamEndGrace = 5 * time.Second
)

// nextRestart says, given when the daemon was restarted before, whether it may be restarted
// now and after what delay.
func nextRestart(past []time.Time, now time.Time) (time.Duration, bool) {
	recent := 0
	for _, t := range past {
		if now.Sub(t) < restartWindow {
			recent++
		}
	}
	if recent >= maxRestarts {
		return 0, false
	}
	return firstRestartDelay << recent, true
}

// daemonSession is the launcher's hold on its libvirtd: the daemon, and the connection and
// lifecycle event stream it has open to it. When the daemon dies, recover starts it again and
// opens both anew; whatever uses the connection takes it from Conn at each use.
type daemonSession struct {
	daemon   *domain.Libvirtd
	notifier *Notifier
	log      *slog.Logger

	mu     sync.Mutex
	conn   *domain.Conn
	events <-chan domain.Event
	// cancelEvents ends the current event stream when its connection is replaced.
	cancelEvents context.CancelFunc
	// restarts are when the daemon was restarted, for nextRestart; its length is the count of
	// restarts the launcher reports.
	restarts []time.Time
}

// openSession connects to daemon and follows its lifecycle events.
func openSession(ctx context.Context, daemon *domain.Libvirtd, notifier *Notifier, log *slog.Logger) (*daemonSession, error) {
	s := &daemonSession{daemon: daemon, notifier: notifier, log: log}
	if err := s.connect(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Conn is the current connection to the daemon.
func (s *daemonSession) Conn() *domain.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn
}

// Events is the current connection's lifecycle event stream; it ends when the connection does.
func (s *daemonSession) Events() <-chan domain.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events
}

// Restarts is how many times the daemon was restarted.
func (s *daemonSession) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.restarts)
}

// connect opens a connection and its event stream and makes them the current ones, closing
// those they replace.
func (s *daemonSession) connect(ctx context.Context) error {
	conn, err := domain.Connect(s.daemon.Socket())
	if err != nil {
		return err
	}
	evCtx, cancel := context.WithCancel(ctx)
	events, err := conn.Events(evCtx)
	if err != nil {
		cancel()
		_ = conn.Close()
		return err
	}
	s.mu.Lock()
	old, oldCancel := s.conn, s.cancelEvents
	s.conn, s.events, s.cancelEvents = conn, events, cancel
	s.mu.Unlock()
	if old != nil {
		oldCancel()
		// Its daemon is gone, so this only frees it; a call still on it fails at once.
		go func() { _ = old.Close() }()
	}
	return nil
}

// Close closes the current connection.
func (s *daemonSession) Close() {
	s.mu.Lock()
	conn, cancel := s.conn, s.cancelEvents
	s.mu.Unlock()
	cancel()
	_ = conn.Close()
}

// recover is called when the event stream ended or the daemon exited. A daemon that exited is
// restarted (nextRestart says when, and when to give up); a connection that broke while its
// daemon runs is opened again. It returns once there is a working connection and event stream,
// or with the error that ends the launcher.
func (s *daemonSession) recover(ctx context.Context) error {
	select {
	case <-s.daemon.Done():
	case <-time.After(streamEndGrace):
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		select {
		case <-s.daemon.Done():
		default:
			s.log.Warn("the libvirt connection broke while libvirtd runs; connecting again")
			return s.connect(ctx)
		}
		s.mu.Lock()
		delay, ok := nextRestart(s.restarts, time.Now())
		total := len(s.restarts)
		s.mu.Unlock()
		if !ok {
			return fmt.Errorf("libvirtd exited again after %d restarts within %s; giving up; see %s", maxRestarts, restartWindow, s.daemon.LogPath())
		}
		s.log.Warn("libvirtd exited; restarting it, the guest runs on meanwhile", "after", delay, "restartsSoFar", total, "log", s.daemon.LogPath())
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		start := time.Now()
		s.mu.Lock()
		s.restarts = append(s.restarts, start)
		total = len(s.restarts)
		s.mu.Unlock()
		restartCtx, cancel := context.WithTimeout(ctx, restartTimeout)
		err := s.daemon.Restart(restartCtx)
		cancel()
		if err != nil {
			s.log.Warn("restarting libvirtd failed", "err", err, "restarts", total)
			continue
		}
		if err := s.connect(ctx); err != nil {
			return fmt.Errorf("connecting to the restarted libvirtd: %w", err)
		}
		s.log.Warn("libvirtd restarted", "restarts", total, "took", time.Since(start).Round(time.Millisecond))
		s.notifier.Report(notify.KindLibvirtdRestarted, start, 0,
			fmt.Sprintf("the launcher's libvirtd exited and was restarted (%d restart(s) so far)", total))
		return nil
	}
}
