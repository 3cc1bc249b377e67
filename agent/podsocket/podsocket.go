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

	"golang.org/x/sys/unix"
)

// Listen listens on path for the launcher, whose user is not root: the socket is made
// connectable by anyone who sees it, which is the pod that owns the directory and root. A
// socket left at path by an earlier listener is replaced; anything else there is an error.
func Listen(path string) (*net.UnixListener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := openToPod(path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
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

// WithPath calls use with a path that names the socket at path as it is now (a
// /proc/self/fd link to it, opened without following a symlink): a connection made through
// it reaches that very socket even if path is replaced meanwhile. It fails if path is not a
// socket. The path is valid only during use, and only in this process.
func WithPath(path string, use func(resolved string) error) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("%s is not a socket (mode %o): refusing it", path, st.Mode)
	}
	return use(fmt.Sprintf("/proc/self/fd/%d", fd))
}

// openToPod makes the socket at path connectable by any user, through a descriptor of the
// socket itself: a chmod of path would follow a symlink swapped in after the listen.
func openToPod(path string) error {
	return WithPath(path, func(resolved string) error {
		if err := os.Chmod(resolved, 0o666); err != nil {
			return fmt.Errorf("opening %s to its pod: %w", path, err)
		}
		return nil
	})
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
