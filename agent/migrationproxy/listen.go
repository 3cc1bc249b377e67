package migrationproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
)

// ListenUnix listens on the unix socket path in the source launcher's directory (the source
// side: the launcher's libvirt and QEMU connect to it, as the launcher's user) and forwards
// each connection to what dialTarget returns, a connection to the target node's proxy. A
// socket file left at path by an earlier, crashed proxy is replaced; any other file there is
// an error. The proxy closes when ctx ends or Close is called.
func ListenUnix(ctx context.Context, path string, dialTarget func(ctx context.Context) (net.Conn, error)) (*Proxy, error) {
	ln, err := podsocket.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("listening for migration streams on %s: %w", path, err)
	}
	return serve(ctx, ln, dialTarget, nil), nil
}

// ListenTLS listens on addr (the target side: the source node's proxy connects to it) and
// forwards each connection, once its TLS handshake under config has succeeded, to the unix
// socket targetUnixPath, such as the target launcher's libvirt socket or the socket the
// destination QEMU listens on for the incoming migration (dialled as podsocket.Dial does: a
// launcher cannot point it elsewhere). A connection whose handshake fails (no certificate,
// another node's, another migration's) is closed before the target socket is even dialled, so
// nothing of it reaches libvirt or QEMU; refused, if not nil, is told why.
// That socket may appear only after the first connection arrives (QEMU creates it once the
// source's libvirt has prepared the destination), so dialing it is retried for TargetWait.
// The proxy closes when ctx ends or Close is called.
func ListenTLS(ctx context.Context, addr, targetUnixPath string, config *tls.Config, refused func(error)) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for migration streams on %s: %w", addr, err)
	}
	return serve(ctx, tls.NewListener(ln, config), dialTarget(targetUnixPath), refused), nil
}

// dialTarget dials the target socket, retried for TargetWait.
func dialTarget(path string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) { return dialUnixRetry(ctx, path, TargetWait) }
}

// ListenTCP is ListenTLS without TLS: what the proxies carried before migrations were
// encrypted, kept as the baseline that benchmarks measure TLS against. Agents never use it.
func ListenTCP(ctx context.Context, addr, targetUnixPath string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for migration streams on %s: %w", addr, err)
	}
	return serve(ctx, ln, dialTarget(targetUnixPath), nil), nil
}

// DialTLS is the source side's dial of a target proxy at addr under config.
func DialTLS(addr string, config *tls.Config) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: config}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("connecting to the target proxy %s: %w", addr, err)
		}
		return c, nil
	}
}

// HandshakeTimeout bounds a TLS handshake, so a peer that connects and says nothing holds
// nothing for long.
const HandshakeTimeout = 10 * time.Second

// TargetWait is how long a target proxy (ListenTLS, ListenTCP) waits for its target socket to accept connections.
const TargetWait = 10 * time.Second

// dialRetryInterval is how often a missing target socket is tried again.
const dialRetryInterval = 20 * time.Millisecond

// dialUnixRetry dials the unix socket path until it accepts, wait has passed, or ctx ends.
func dialUnixRetry(ctx context.Context, path string, wait time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ticker := time.NewTicker(dialRetryInterval)
	defer ticker.Stop()
	for {
		c, err := podsocket.Dial(ctx, path)
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
