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
	conns []net.Conn
	cut   bool
	// admitted is the process whose connections the relay takes: the child's (admit).
	admitted int
}

// relaySocket is the relay's socket in its directory.
const relaySocket = "libvirt-sock"

// newLibvirtRelay relays connections made to its Path to the launcher's socket target, which
// must stay open until Cut. Its socket is in a new directory under parent, which is root's alone;
// the directory and the socket are given to uid and gid, the child's, which binds the directory
// into its own root.
func newLibvirtRelay(parent string, target *podsocket.Socket, uid, gid int) (*libvirtRelay, error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("making the directory of libvirt relays: %w", err)
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
	for _, p := range []string{dir, filepath.Join(dir, relaySocket)} {
		if err := os.Lchown(p, uid, gid); err != nil {
			_ = ln.Close()
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("giving the libvirt relay's socket to the client's user: %w", err)
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
		up, err := net.Dial("unix", r.target.Path())
		if err != nil {
			_ = c.Close()
			continue
		}
		if !r.track(c, up) {
			return
		}
		go relay(c, up)
	}
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

// track records a relayed pair so that Cut ends it; false (and both closed) once cut.
func (r *libvirtRelay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	r.conns = append(r.conns, conns...)
	return true
}

// Cut ends every relayed connection and takes no more: the client's calls on them fail at once.
func (r *libvirtRelay) Cut() {
	r.mu.Lock()
	if r.cut {
		r.mu.Unlock()
		return
	}
	r.cut = true
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	_ = r.ln.Close()
	for _, c := range conns {
		_ = c.Close()
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
