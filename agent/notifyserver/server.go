// Package notifyserver is the agent's end of the notify sockets: one in each launcher's
// directory, a volume of that launcher's pod, so that whoever connects there is that VM's
// launcher (or root on the node). It accepts launcher connections, checks who is calling and
// that every message is about the socket's own VMI, decodes frames and hands valid messages
// on. A bad peer or a bad frame costs only its own connection.
package notifyserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// Handler receives each valid message, with the peer's process ID.
type Handler func(m *notify.Message, peerPID int32)

// Server serves the notify sockets.
type Server struct {
	allowedUIDs map[uint32]bool
	handle      Handler
	log         *slog.Logger
	// idle closes a connection that sends nothing for this long; launchers keep theirs open
	// and quiet, so this is long, but it bounds a stuck peer.
	idle time.Duration

	rejected *prometheus.CounterVec
	received *prometheus.CounterVec
}

// New makes a server that accepts peers running as one of allowedUIDs.
func New(allowedUIDs []uint32, handle Handler, reg prometheus.Registerer, log *slog.Logger) *Server {
	s := &Server{
		handle: handle, log: log.With("component", "notify"), idle: 24 * time.Hour,
		allowedUIDs: map[uint32]bool{},
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_notify_rejected_total",
			Help: "Notify connections closed because of a bad peer or frame, by reason.",
		}, []string{"reason"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_notify_messages_total",
			Help: "Valid notify messages received, by kind.",
		}, []string{"kind"}),
	}
	for _, uid := range allowedUIDs {
		s.allowedUIDs[uid] = true
	}
	reg.MustRegister(s.rejected, s.received)
	return s
}

// MaxConnsPerSocket bounds the connections open at once on one launcher's socket: a launcher
// keeps one (two for a moment while it reconnects), and one that opens more, or whoever took
// over its pod, must not make the agent hold goroutines and buffers without end.
const MaxConnsPerSocket = 4

// Serve listens on path, in the launcher directory of the VMI with vmiUID, until ctx ends.
// A stale socket file from an earlier agent is replaced. Connections beyond MaxConnsPerSocket
// are closed at once (reason too-many-connections).
func (s *Server) Serve(ctx context.Context, path, vmiUID string) error {
	l, err := podsocket.Listen(path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, MaxConnsPerSocket)
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting on %s: %w", path, err)
		}
		select {
		case slots <- struct{}{}:
		default:
			s.reject("too-many-connections", fmt.Errorf("%d connections are open on %s already", MaxConnsPerSocket, path), 0)
			conn.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.serveConn(ctx, conn, vmiUID)
		}()
	}
}

func (s *Server) serveConn(ctx context.Context, conn *net.UnixConn, vmiUID string) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	cred, err := peerCredentials(conn)
	if err != nil {
		s.reject("credentials", err, 0)
		return
	}
	if !s.allowedUIDs[cred.Uid] {
		s.reject("unauthorised", fmt.Errorf("peer pid %d runs as uid %d", cred.Pid, cred.Uid), cred.Pid)
		return
	}
	var hello *notify.VMIRef
	for {
		_ = conn.SetReadDeadline(time.Now().Add(s.idle))
		m, err := notify.Read(conn)
		if errors.Is(err, io.EOF) || (err != nil && ctx.Err() != nil) {
			return
		}
		if err != nil {
			s.reject(reasonOf(err), err, cred.Pid)
			return
		}
		switch {
		case hello == nil && m.Kind != notify.KindHello:
			s.reject("no-hello", fmt.Errorf("first message is %s, want Hello", m.Kind), cred.Pid)
			return
		case hello == nil && m.VMI.UID != vmiUID:
			s.reject("wrong-vmi", fmt.Errorf("hello for %s on the socket of VMI %s", m.VMI, vmiUID), cred.Pid)
			return
		case hello != nil && m.VMI != *hello:
			s.reject("vmi-mismatch", fmt.Errorf("message for %s on a connection for %s", m.VMI, hello), cred.Pid)
			return
		case hello == nil:
			ref := m.VMI
			hello = &ref
		}
		s.received.WithLabelValues(string(m.Kind)).Inc()
		s.handle(m, cred.Pid)
	}
}

func (s *Server) reject(reason string, err error, pid int32) {
	s.rejected.WithLabelValues(reason).Inc()
	s.log.Warn("closing notify connection", "reason", reason, "peerPID", pid, "err", err)
}

func reasonOf(err error) string {
	switch {
	case errors.Is(err, notify.ErrVersion):
		return "version"
	case errors.Is(err, notify.ErrTooLarge):
		return "oversized"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "idle"
	default:
		return "malformed"
	}
}

func peerCredentials(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, credErr
}
