// Package podsocket is how the agent, as root on the node, listens on and dials unix sockets
// in a launcher's directory: a volume of the launcher's pod, which the launcher (and so
// whoever took over a guest's QEMU) may change at any moment. The directory itself is
// trusted (the agent resolved it to the pod's volume); the name in it is not, so no call here
// follows a symlink there or acts on anything but a socket. Without that, a launcher could
// point a name at another VM's libvirt socket, and the agent would connect it there as root,
// or at a node file, and the agent would open its permissions.
package podsocket

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Listen listens on path for the launcher, whose user is not root: the socket is made
// connectable by anyone who sees it, which is the pod that owns the directory and root. A
// socket left at path by an earlier listener is replaced; anything else there is an error.
func Listen(path string) (*Listener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// Close removes the file only while it is still this listener's (see Listener.Close).
	ln.SetUnlinkOnClose(false)
	// The mode is set through a descriptor of the socket itself: a chmod of path would follow a
	// symlink swapped in after the listen.
	s, err := Open(path)
	if err != nil {
		ln.Close()
		return nil, err
	}
	defer s.Close()
	if err := os.Chmod(s.Path(), 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("opening %s to its pod: %w", path, err)
	}
	return &Listener{UnixListener: ln, path: path, ino: s.ino}, nil
}

// Listener is a listening socket in a launcher's directory.
type Listener struct {
	*net.UnixListener
	path string
	ino  uint64
}

// Close stops listening and removes the socket file, unless another listener's socket has
// replaced it at the same path meanwhile (a notify socket served again, a migration retried).
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	if fi, statErr := os.Lstat(l.path); statErr == nil && fi.Mode().Type() == fs.ModeSocket {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Ino == l.ino {
			_ = os.Remove(l.path)
		}
	}
	return err
}

// Dial connects to the socket at path, which must be a socket and not a symlink.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	var conn net.Conn
	err := WithPath(path, func(resolved string) error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "unix", resolved)
		return err
	})
	return conn, err
}

// WithPath calls use with a path that names the socket at path as it is now (see Open); the
// path is valid only during use.
func WithPath(path string, use func(resolved string) error) error {
	s, err := Open(path)
	if err != nil {
		return err
	}
	defer s.Close()
	return use(s.Path())
}

// Socket is a socket file held open without following a symlink (O_PATH).
type Socket struct {
	f   *os.File
	ino uint64
}

// Open opens the socket at path as it is now; it fails if path is not a socket. A connection
// made through Path reaches that very socket even if path is replaced meanwhile.
func Open(path string) (*Socket, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a socket (mode %o): refusing it", path, st.Mode)
	}
	return &Socket{f: os.NewFile(uintptr(fd), path), ino: st.Ino}, nil
}

// Path names the socket (a /proc/self/fd link), in this process only, until Close.
func (s *Socket) Path() string { return fmt.Sprintf("/proc/self/fd/%d", s.f.Fd()) }

// Close releases the socket file.
func (s *Socket) Close() error { return s.f.Close() }

// listenPoll is how often AwaitListening tries a socket that refuses connections.
const listenPoll = 5 * time.Millisecond

// AwaitListening returns once the socket accepts a connection (made and closed at once), trying
// again while it refuses them, for at most within or until ctx ends. A daemon's socket file
// appears when it binds, a moment before it listens: a connect in between is refused, though the
// daemon is about to serve. Any other error returns at once.
func (s *Socket) AwaitListening(ctx context.Context, within time.Duration) error {
	var refused error
	err := wait.PollUntilContextTimeout(ctx, listenPoll, within, true, func(ctx context.Context) (bool, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", s.Path())
		if err == nil {
			return true, conn.Close()
		}
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			refused = err
			return false, nil
		case ctx.Err() != nil:
			return false, nil // the wait's end, which the poll reports
		}
		return false, err
	})
	if wait.Interrupted(err) && refused != nil {
		return errors.Join(refused, err)
	}
	return err
}

// removeStale removes a socket file at path; nothing at path is fine.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking for a stale socket at %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("cannot listen on %s: the path exists and is not a socket (mode %s)", path, fi.Mode())
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("removing the stale socket %s: %w", path, err)
	}
	return nil
}
