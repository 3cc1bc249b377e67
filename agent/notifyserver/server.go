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

// EndHandler is told that the connection of the VMI with vmiUID ended cleanly after its hello:
// every message the launcher sent on it has been handled.
type EndHandler func(vmiUID string)

// NetworkHandler builds the pod network of the VMI ref in the network namespace netns, which
// its launcher sent, and returns what the guest is to be offered.
type NetworkHandler func(ctx context.Context, ref notify.VMIRef, netns *os.File) (*notify.Lease, error)

// CapabilitiesSource returns a copy of the node's probed QEMU capabilities for one launcher
// (the caller closes it), or why there is none.
type CapabilitiesSource func() (*os.File, error)

// Server serves the notify sockets.
type Server struct {
	allowedUIDs map[uint32]bool
	handle      Handler
	network     NetworkHandler
	capsSource  CapabilitiesSource
	ended       EndHandler
	log         *slog.Logger
	// idle closes a connection that sends nothing for this long; launchers keep theirs open
	// and quiet, so this is long, but it bounds a stuck peer.
	idle time.Duration

	rejected *prometheus.CounterVec
	received *prometheus.CounterVec
	caps     *prometheus.CounterVec

	peersMu sync.Mutex
	// peers are the connections past their hello, by VMI UID: what Tell writes to.
	peers map[string]map[*peer]bool
}

// peer is a launcher's connection; its writes (answers and Tell) take turns.
type peer struct {
	mu   sync.Mutex
	conn *net.UnixConn
}

func (p *peer) write(m *notify.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return notify.Write(p.conn, m)
}

func (p *peer) writeWithFile(m *notify.Message, f *os.File) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return notify.WriteWithFile(p.conn, m, f)
}

// New makes a server that accepts peers running as one of allowedUIDs.
func New(allowedUIDs []uint32, handle Handler, reg prometheus.Registerer, log *slog.Logger) *Server {
	s := &Server{
		handle: handle, log: log.With("component", "notify"), idle: 24 * time.Hour,
		allowedUIDs: map[uint32]bool{}, peers: map[string]map[*peer]bool{},
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_notify_rejected_total",
			Help: "Notify connections closed because of a bad peer or frame, by reason.",
		}, []string{"reason"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_notify_messages_total",
			Help: "Valid notify messages received, by kind.",
		}, []string{"kind"}),
		caps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_qemu_capabilities_answers_total",
			Help: "Answers to launchers asking for the node's probed QEMU capabilities: given (a copy of the probe's file) or none (the launcher probes QEMU itself).",
		}, []string{"result"}),
	}
	for _, uid := range allowedUIDs {
		s.allowedUIDs[uid] = true
	}
	reg.MustRegister(s.rejected, s.received, s.caps)
	return s
}

// HandleNetwork sets what answers NetworkSetup requests; without one they are refused.
func (s *Server) HandleNetwork(h NetworkHandler) { s.network = h }

// HandleQEMUCapabilities sets what answers QEMUCapabilities requests; without one the answer
// is that the agent has none.
func (s *Server) HandleQEMUCapabilities(c CapabilitiesSource) { s.capsSource = c }

// HandleEnd sets the handler of connections' clean ends.
func (s *Server) HandleEnd(h EndHandler) { s.ended = h }

// Tell writes m to every connection of the launcher of the VMI with vmiUID, and reports
// whether one took it. A launcher that is not connected misses it: what the agent tells is
// never more than a launcher may do without.
func (s *Server) Tell(vmiUID string, m *notify.Message) bool {
	s.peersMu.Lock()
	var to []*peer
	for p := range s.peers[vmiUID] {
		to = append(to, p)
	}
	s.peersMu.Unlock()
	told := false
	for _, p := range to {
		if err := p.write(m); err != nil {
			s.log.Warn("telling a launcher", "vmi", m.VMI.String(), "kind", m.Kind, "err", err)
			continue
		}
		told = true
	}
	return told
}

func (s *Server) addPeer(uid string, p *peer) {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	if s.peers[uid] == nil {
		s.peers[uid] = map[*peer]bool{}
	}
	s.peers[uid][p] = true
}

func (s *Server) removePeer(uid string, p *peer) {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	delete(s.peers[uid], p)
	if len(s.peers[uid]) == 0 {
		delete(s.peers, uid)
	}
}

// agentKinds are the messages only the agent sends; a launcher sending one is refused.
var agentKinds = map[notify.Kind]bool{
	notify.KindNetworkReady: true, notify.KindNetworkFailed: true, notify.KindHandoverDone: true, notify.KindQEMUCapabilitiesFile: true,
	notify.KindGuestMemoryQuery: true,
}

// MaxConnsPerSocket bounds the connections open at once on one launcher's socket: a launcher
// keeps one (two for a moment while it reconnects), and one that opens more, or whoever took
// over its pod, must not make the agent hold goroutines and buffers without end.
const MaxConnsPerSocket = 4

// Serve listens on path, in the launcher directory of the VMI vmi, until ctx ends. vmi is what
// the agent knows of the VMI (its namespace and name with its UID, not what a launcher says): a
// hello that names another VMI, by UID, namespace or name, is refused (reason wrong-vmi), so
// every message handed on names the socket's own VMI. A stale socket file from an earlier agent
// is replaced. Connections beyond MaxConnsPerSocket are closed at once (reason
// too-many-connections).
func (s *Server) Serve(ctx context.Context, path string, vmi notify.VMIRef) error {
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
			s.serveConn(ctx, conn, vmi)
		}()
	}
}

func (s *Server) serveConn(ctx context.Context, conn *net.UnixConn, vmi notify.VMIRef) {
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
	in := &notify.FileReader{Conn: conn}
	defer in.CloseAll()
	out := &peer{conn: conn}
	defer s.removePeer(vmi.UID, out)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(s.idle))
		m, err := notify.Read(in)
		if errors.Is(err, io.EOF) && hello != nil && s.ended != nil {
			s.ended(hello.UID)
		}
		if errors.Is(err, io.EOF) || (err != nil && ctx.Err() != nil) {
			return
		}
		if err == nil {
			// io.ReadFull drops an error that came with the bytes it wanted.
			err = in.Err()
		}
		if err != nil {
			s.reject(reasonOf(err), err, cred.Pid)
			return
		}
		switch {
		case hello == nil && m.Kind != notify.KindHello:
			s.reject("no-hello", fmt.Errorf("first message is %s, want Hello", m.Kind), cred.Pid)
			return
		case hello == nil && m.VMI != vmi:
			s.reject("wrong-vmi", fmt.Errorf("hello for %s on the socket of VMI %s", m.VMI, vmi), cred.Pid)
			return
		case hello != nil && m.VMI != *hello:
			s.reject("vmi-mismatch", fmt.Errorf("message for %s on a connection for %s", m.VMI, hello), cred.Pid)
			return
		case agentKinds[m.Kind]:
			s.reject("agent-kind", fmt.Errorf("a launcher sent %s, which only the agent sends", m.Kind), cred.Pid)
			return
		case hello == nil:
			ref := m.VMI
			hello = &ref
			s.addPeer(vmi.UID, out)
		}
		if m.Kind == notify.KindNetworkSetup {
			ns := in.Take()
			if ns == nil {
				s.reject("no-namespace", errors.New("NetworkSetup without a network namespace descriptor"), cred.Pid)
				return
			}
			s.received.WithLabelValues(string(m.Kind)).Inc()
			err := s.answerNetwork(ctx, out, *hello, ns)
			ns.Close()
			if err != nil {
				s.log.Warn("answering NetworkSetup", "vmi", hello.String(), "err", err)
				return
			}
			continue
		}
		if in.Pending() {
			s.reject("unexpected-descriptor", fmt.Errorf("a %s message came with a descriptor", m.Kind), cred.Pid)
			return
		}
		s.received.WithLabelValues(string(m.Kind)).Inc()
		if m.Kind == notify.KindQEMUCapabilities {
			if err := s.answerCapabilities(out, *hello); err != nil {
				s.log.Warn("answering QEMUCapabilities", "vmi", hello.String(), "err", err)
				return
			}
			continue
		}
		s.handle(m, cred.Pid)
	}
}

// answerCapabilities writes the node's probed QEMU capabilities, or why there are none, to out.
func (s *Server) answerCapabilities(out *peer, ref notify.VMIRef) error {
	reply := &notify.Message{Kind: notify.KindQEMUCapabilitiesFile, VMI: ref, Time: time.Now()}
	var f *os.File
	err := errors.New("this agent has no QEMU capabilities to give")
	if s.capsSource != nil {
		f, err = s.capsSource()
	}
	if err != nil {
		s.caps.WithLabelValues("none").Inc()
		reply.Reason = err.Error()
		return out.write(reply)
	}
	defer f.Close()
	s.caps.WithLabelValues("given").Inc()
	return out.writeWithFile(reply, f)
}

// answerNetwork builds the VMI's pod network and writes the answer back to out.
func (s *Server) answerNetwork(ctx context.Context, out *peer, ref notify.VMIRef, ns *os.File) error {
	reply := &notify.Message{Kind: notify.KindNetworkReady, VMI: ref}
	var err error
	if s.network == nil {
		err = errors.New("this agent builds no pod networks")
	} else {
		reply.Lease, err = s.network(ctx, ref, ns)
	}
	if err != nil {
		reply.Kind, reply.Reason, reply.Lease = notify.KindNetworkFailed, err.Error(), nil
		s.log.Warn("could not build the pod network", "vmi", ref.String(), "err", err)
	}
	reply.Time = time.Now()
	return out.write(reply)
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
