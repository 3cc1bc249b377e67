package migrationproxy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"
)

// ListenUnix listens on the unix socket path (the source side: libvirt and QEMU connect to
// it) and forwards each connection to what dialTarget returns, a connection to the target
// node's proxy. A socket file left at path by an earlier, crashed proxy is replaced; any
// other file there is an error. The proxy closes when ctx ends or Close is called.
func ListenUnix(ctx context.Context, path string, dialTarget func(ctx context.Context) (net.Conn, error)) (*Proxy, error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening for migration streams on %s: %w", path, err)
	}
	return serve(ctx, ln, dialTarget), nil
}

// ListenTCP listens on addr (the target side: the source node's proxy connects to it) and
// forwards each connection to the unix socket targetUnixPath, such as the target launcher's
// libvirt socket or the socket the destination QEMU listens on for the incoming migration.
// That socket may appear only after the first connection arrives (QEMU creates it once the
// source's libvirt has prepared the destination), so dialing it is retried for TargetWait.
// The proxy closes when ctx ends or Close is called.
func ListenTCP(ctx context.Context, addr, targetUnixPath string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for migration streams on %s: %w", addr, err)
	}
	return serve(ctx, ln, func(ctx context.Context) (net.Conn, error) {
		return dialUnixRetry(ctx, targetUnixPath, TargetWait)
	}), nil
}

// TargetWait is how long ListenTCP waits for its target socket to accept connections.
const TargetWait = 10 * time.Second

// dialRetryInterval is how often a missing target socket is tried again.
const dialRetryInterval = 20 * time.Millisecond

// dialUnixRetry dials the unix socket path until it accepts, wait has passed, or ctx ends.
func dialUnixRetry(ctx context.Context, path string, wait time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var d net.Dialer
	ticker := time.NewTicker(dialRetryInterval)
	defer ticker.Stop()
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dialing the migration target %s for %s: %w (last error: %w)", path, wait, ctx.Err(), err)
		case <-ticker.C:
		}
	}
}

// removeStaleSocket removes a socket file at path; nothing at path is fine.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking for a stale socket at %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("listening for migration streams on %s: the path exists and is not a socket (mode %s)", path, fi.Mode())
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("removing the stale socket %s: %w", path, err)
	}
	return nil
}
