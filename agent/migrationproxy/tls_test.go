package migrationproxy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/test/nodecert"
)

// countingServer is the target launcher's socket, counting every connection and byte it sees.
type countingServer struct{ conns, bytes atomic.Int64 }

func (s *countingServer) handle(c *net.UnixConn) {
	s.conns.Add(1)
	n, _ := io.Copy(io.Discard, c)
	s.bytes.Add(n)
}

// TestTargetProxyRefusesAllButTheMigrationsSource tries the target proxy of migration mig-1 from
// node-a as an attacker that can reach its port would, and as the real source does.
func TestTargetProxyRefusesAllButTheMigrationsSource(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target.sock")
	var seen countingServer
	server(t, target, seen.handle)
	ca := nodecert.NewCA(t)
	var refused atomic.Int64
	dst := listenTarget(t, t.Context(), target, nodecert.Issue(t, ca, targetNode), func(error) { refused.Add(1) })
	addr := dst.Addr().String()
	client := func(certs migrationtls.Certificates, uid string) *tls.Config {
		c, err := migrationtls.ClientConfig(certs, uid, targetNode)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	source := nodecert.Issue(t, ca, sourceNode)
	// A client that sends no certificate at all (the config has none to give).
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: source.Trust, ServerName: targetNode, NextProtos: []string{migrationtls.Protocol(migrationUID)}}
	otherCA := nodecert.Issue(t, nodecert.NewCA(t), sourceNode)
	otherCA.Trust = source.Trust // it trusts the real CA, but its own certificate is from another

	attempts := []struct {
		name string
		dial func(ctx context.Context) (net.Conn, error)
	}{
		{"plain TCP, no TLS", func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "tcp", addr) }},
		{"TLS without a client certificate", DialTLS(addr, noCert)},
		{"another node's certificate (node-c)", DialTLS(addr, client(nodecert.Issue(t, ca, "node-c"), migrationUID))},
		{"the target's own certificate", DialTLS(addr, client(nodecert.Issue(t, ca, targetNode), migrationUID))},
		{"the source node's certificate for another migration", DialTLS(addr, client(source, "mig-2"))},
		{"a certificate for node-a from another CA", DialTLS(addr, client(otherCA, migrationUID))},
	}
	for i, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			c, err := a.dial(t.Context())
			if err == nil {
				_ = c.SetDeadline(time.Now().Add(testTimeout))
				// What a forger would send: the start of a libvirt RPC stream.
				_, _ = c.Write([]byte("\x00\x00\x00\x1c\x20\x00\x80\x86 forged libvirt call"))
				if n, rerr := c.Read(make([]byte, 1)); rerr == nil {
					t.Errorf("the target proxy answered %d bytes, want the connection closed", n)
				}
				c.Close()
			}
			err = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
				return refused.Load() == int64(i+1), nil
			})
			if err != nil {
				t.Fatalf("the target proxy counted %d refusals, want %d", refused.Load(), i+1)
			}
			if seen.conns.Load() != 0 || seen.bytes.Load() != 0 {
				t.Fatalf("the target socket saw %d connections and %d bytes, want none", seen.conns.Load(), seen.bytes.Load())
			}
		})
	}

	t.Run("the source node, for this migration: forwarded", func(t *testing.T) {
		c, err := DialTLS(addr, client(source, migrationUID))(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte("the guest's memory")
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.Close()
		err = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
			return seen.bytes.Load() == int64(len(msg)), nil
		})
		if err != nil {
			t.Fatalf("the target socket saw %d bytes, want %d", seen.bytes.Load(), len(msg))
		}
	})
}

// TestSourceProxyRefusesAnotherTarget: a source that reaches a node other than the migration's
// target (an address taken over, say) sends it nothing.
func TestSourceProxyRefusesAnotherTarget(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target.sock")
	var seen countingServer
	server(t, target, seen.handle)
	ca := nodecert.NewCA(t)
	// node-c listens where the source expects node-b.
	impostor := listenTarget(t, t.Context(), target, nodecert.Issue(t, ca, "node-c"), nil)
	client, err := migrationtls.ClientConfig(nodecert.Issue(t, ca, sourceNode), migrationUID, targetNode)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := DialTLS(impostor.Addr().String(), client)(t.Context()); err == nil {
		c.Close()
		t.Fatal("the source completed a handshake with node-c as the target node-b")
	}
	if seen.conns.Load() != 0 {
		t.Fatalf("the impostor's socket saw %d connections", seen.conns.Load())
	}
}

// BenchmarkStream sends a migration stream through a source and a target proxy, in plain TCP
// (what the proxies carried before) and in TLS 1.3, interleaved in one run: compare with
// benchstat. The target discards, as a fast destination QEMU would.
func BenchmarkStream(b *testing.B) {
	const size = 64 << 20
	dir := shortDir(b)
	target := filepath.Join(dir, "target.sock")
	server(b, target, func(c *net.UnixConn) { _, _ = io.Copy(io.Discard, c) })
	ca := nodecert.NewCA(b)
	serverCfg, err := migrationtls.ServerConfig(nodecert.Issue(b, ca, targetNode), migrationUID, sourceNode)
	if err != nil {
		b.Fatal(err)
	}
	clientCfg, err := migrationtls.ClientConfig(nodecert.Issue(b, ca, sourceNode), migrationUID, targetNode)
	if err != nil {
		b.Fatal(err)
	}
	plain, err := ListenTCP(b.Context(), "127.0.0.1:0", target)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = plain.Close() })
	encrypted, err := ListenTLS(b.Context(), "127.0.0.1:0", target, serverCfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = encrypted.Close() })
	chunk := make([]byte, 1<<20)
	for _, mode := range []struct {
		name string
		dial func(ctx context.Context) (net.Conn, error)
	}{
		{"transport=tcp", func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", plain.Addr().String())
		}},
		{"transport=tls1.3", DialTLS(encrypted.Addr().String(), clientCfg)},
	} {
		b.Run(mode.name, func(b *testing.B) {
			src, err := ListenUnix(b.Context(), filepath.Join(dir, "src.sock"), mode.dial)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			b.SetBytes(size)
			for b.Loop() {
				c, err := net.Dial("unix", filepath.Join(dir, "src.sock"))
				if err != nil {
					b.Fatal(err)
				}
				for sent := 0; sent < size; sent += len(chunk) {
					if _, err := c.Write(chunk); err != nil {
						b.Fatal(err)
					}
				}
				_ = c.(*net.UnixConn).CloseWrite()
				// The end of the answer stream means the target read everything and closed.
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}
		})
	}
}
