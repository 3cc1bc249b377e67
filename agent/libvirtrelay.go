package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
)

// libvirtRelay is the agent's own end of its connections to one launcher's libvirt. libvirt's C
// client, which runs for the agent in a confined child (libvirtclient), cannot be interrupted in a
// call: it waits for the daemon's reply for as long as the daemon keeps the connection alive, and
// a launcher's daemon is the tenant's to replace. So the client does not connect to the launcher's
// socket itself but to the relay's, in a directory of its own that the child alone sees (and that
// the agent's other processes cannot reach: its parent is root's), and the relay carries the
// bytes to and from the launcher's socket, which the agent holds open. Cutting the relay ends the
// stream under the client, which then fails every call waiting on it at once.
type libvirtRelay struct {
	dir    string
	ln     *net.UnixListener
	target *podsocket.Socket

	mu    sync.Mutex
	pairs map[*relayedPair]struct{}
	cut   bool
	// admitted is the process whose connections the relay takes: the child's (admit).
	admitted int
}

// relaySocket is the relay's socket in its directory.
const relaySocket = "libvirt-sock"

// newLibvirtRelay relays connections made to its Path to the launcher's socket target, which
// must stay open until Cut. Its socket is in a new directory under parent, which is root's alone:
// the directory and the socket are open to every user (the agent may not give them to another
// without CAP_CHOWN), and only the child that binds the directory into its own root reaches them.
func newLibvirtRelay(parent string, target *podsocket.Socket) (*libvirtRelay, error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("making the directory of libvirt relays: %w", err)
	}
	if err := os.Chmod(parent, 0o700); err != nil {
		return nil, fmt.Errorf("closing the directory of libvirt relays to other users: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "relay-") // 0700
	if err != nil {
		return nil, fmt.Errorf("making a libvirt relay's directory: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, relaySocket), Net: "unix"})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("listening for libvirt's client: %w", err)
	}
	for p, mode := range map[string]os.FileMode{dir: 0o711, filepath.Join(dir, relaySocket): 0o666} {
		if err := os.Chmod(p, mode); err != nil {
			_ = ln.Close()
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("opening the libvirt relay's socket to the client's user: %w", err)
		}
	}
	r := &libvirtRelay{dir: dir, ln: ln, target: target}
	go r.serve()
	return r, nil
}

// Path is the socket libvirt's client connects to.
func (r *libvirtRelay) Path() string { return filepath.Join(r.dir, relaySocket) }

func (r *libvirtRelay) serve() {
	for {
		c, err := r.ln.AcceptUnix()
		if err != nil {
			return // cut
		}
		// Only the admitted child: no other process sees the directory, and one that did is turned away.
		if pid, err := peerPID(c); err != nil || pid == 0 || pid != r.admittedPID() {
			_ = c.Close()
			continue
		}
		if r.open() >= maxRelayedPairs {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("unix", r.target.Path())
		if err != nil {
			_ = c.Close()
			continue
		}
		p := &relayedPair{c, up}
		if !r.track(p) {
			return
		}
		go func() {
			relay(c, up)
			r.untrack(p)
		}()
	}
}

// maxRelayedPairs bounds a relay's open connections: libvirt's client holds one, and one more
// while it migrates; a child that opened more would spend the agent's file descriptors.
const maxRelayedPairs = 4

// relayedPair is a connection from the child and its connection to the launcher's socket.
type relayedPair struct{ down, up net.Conn }

func (p *relayedPair) close() { _, _ = p.down.Close(), p.up.Close() }

func (r *libvirtRelay) open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pairs)
}

// admit has the relay take the connections of process pid (the child's, as the agent sees it) and
// of no other.
func (r *libvirtRelay) admit(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admitted = pid
}

func (r *libvirtRelay) admittedPID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admitted
}

// track records a relayed pair so that Cut ends it; false (and the pair closed) once cut.
func (r *libvirtRelay) track(p *relayedPair) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut {
		p.close()
		return false
	}
	if r.pairs == nil {
		r.pairs = map[*relayedPair]struct{}{}
	}
	r.pairs[p] = struct{}{}
	return true
}

// untrack forgets a pair that ended.
func (r *libvirtRelay) untrack(p *relayedPair) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pairs, p)
}

// Cut ends every relayed connection and takes no more: the client's calls on them fail at once.
func (r *libvirtRelay) Cut() {
	r.mu.Lock()
	if r.cut {
		r.mu.Unlock()
		return
	}
	r.cut = true
	pairs := r.pairs
	r.pairs = nil
	r.mu.Unlock()
	_ = r.ln.Close()
	for p := range pairs {
		p.close()
	}
	_ = os.RemoveAll(r.dir)
}

// relay copies a to b and b to a until either ends, then closes both: libvirt's RPC stream has no
// use for one direction alone.
func relay(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	<-done
	_, _ = a.Close(), b.Close()
	<-done
}

// peerPID is the process at the other end of a unix connection (SO_PEERCRED).
func peerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	if cred == nil {
		return 0, errors.New("no peer credentials")
	}
	return int(cred.Pid), nil
}
