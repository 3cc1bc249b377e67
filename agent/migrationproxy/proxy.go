// Package migrationproxy carries a live migration's streams between nodes. libvirt and QEMU
// on each node see only unix sockets in the VM's per-VMI directory; the agents carry the bytes
// over TLS between nodes (api/migrationtls), so migration traffic crosses nodes only through them.
//
// The source agent listens on unix sockets in the source launcher's directory (ListenUnix) and
// forwards each connection to the target agent; the target agent listens on its node address
// (ListenTLS) and forwards each connection to a unix socket in the target launcher's directory.
package migrationproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Proxy accepts connections and forwards each one, both ways, to a connection it dials.
// It forwards any number of connections at once: libvirt opens more than one.
type Proxy struct {
	ln   net.Listener
	dial func(ctx context.Context) (net.Conn, error)

	// ctx ends when the proxy closes; it bounds the dials of new connections.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // both ends of every forwarded connection
	closed bool

	// refused is told of each connection closed because its TLS handshake failed.
	refused func(error)

	done      sync.WaitGroup // the accept loop and each forwarding
	closeOnce sync.Once
	closeErr  error
}

// serve starts forwarding the connections ln accepts to what dial returns, until Close or ctx ends.
func serve(ctx context.Context, ln net.Listener, dial func(ctx context.Context) (net.Conn, error), refused func(error)) *Proxy {
	pctx, cancel := context.WithCancel(ctx)
	p := &Proxy{ln: ln, dial: dial, refused: refused, ctx: pctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	p.done.Add(1)
	go p.acceptLoop()
	// A cancelled ctx closes the proxy, as Close does, so that a migration's context owns its proxies.
	context.AfterFunc(pctx, func() { _ = p.closeListener() })
	return p
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Close stops listening (removing a unix socket's file), closes every forwarded connection
// and returns once nothing of the proxy runs any more.
func (p *Proxy) Close() error {
	err := p.closeListener()
	p.done.Wait()
	return err
}

// closeListener stops accepting and closes the connections being forwarded.
func (p *Proxy) closeListener() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		if err := p.ln.Close(); err != nil {
			p.closeErr = fmt.Errorf("closing the migration proxy on %s: %w", p.ln.Addr(), err)
		}
	})
	return p.closeErr
}

// track records c as open so Close can close it; it returns false, and closes c, if the
// proxy is already closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

// maxAcceptBackoff bounds the wait after a failed Accept (out of file descriptors, say),
// which would otherwise repeat at once.
const maxAcceptBackoff = time.Second

func (p *Proxy) acceptLoop() {
	defer p.done.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.ctx.Err() != nil {
				return
			}
			slog.Warn("migration proxy: accepting a connection", "addr", p.ln.Addr(), "err", err, "retryIn", backoff)
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxAcceptBackoff)
			continue
		}
		backoff = 5 * time.Millisecond
		if !p.track(c) {
			return
		}
		p.done.Add(1)
		go p.forward(c)
	}
}

// forward dials the target for the accepted connection in and copies between them until
// both directions have ended.
func (p *Proxy) forward(in net.Conn) {
	defer p.done.Done()
	defer p.untrack(in)
	if tc, ok := in.(*tls.Conn); ok {
		ctx, cancel := context.WithTimeout(p.ctx, HandshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			if p.refused != nil {
				p.refused(err)
			}
			slog.Warn("migration proxy: refusing a connection", "addr", p.ln.Addr(), "peer", in.RemoteAddr(), "err", err)
			return
		}
	}
	out, err := p.dial(p.ctx)
	if err != nil {
		if p.ctx.Err() == nil {
			slog.Warn("migration proxy: dialing the target; dropping the connection", "addr", p.ln.Addr(), "err", err)
		}
		return
	}
	if !p.track(out) {
		return
	}
	defer p.untrack(out)
	pipe(in, out)
}
