package migrationproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/test/nodecert"
)

// testTimeout bounds every wait of these tests.
const testTimeout = 20 * time.Second

// shortDir is a temporary directory with a path short enough for unix sockets (108 bytes).
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// server is a unix socket server that runs handle on each connection, as the target
// launcher's libvirt or QEMU would.
func server(t testing.TB, path string, handle func(c *net.UnixConn)) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c.(*net.UnixConn))
			}()
		}
	}()
}

// replyAfterEOF reads its whole request, then answers with its length and the request
// itself: a server that answers only once the client has half-closed its side.
func replyAfterEOF(c *net.UnixConn) {
	req, err := io.ReadAll(c)
	if err != nil {
		return
	}
	_, _ = fmt.Fprintf(c, "%d:", len(req))
	_, _ = c.Write(req)
	_ = c.CloseWrite()
}

// The nodes and migration of chain: node-a sends to node-b.
const (
	sourceNode   = "node-a"
	targetNode   = "node-b"
	migrationUID = "mig-1"
)

// chain is the whole data path: a unix socket on the "source node" forwarded over TLS on
// 127.0.0.1 to the "target node", which forwards to the unix socket target.
func chain(t *testing.T, ctx context.Context, target string) (source string, src, dst *Proxy) {
	t.Helper()
	ca := nodecert.NewCA(t)
	dst = listenTarget(t, ctx, target, nodecert.Issue(t, ca, targetNode), nil)
	source = filepath.Join(filepath.Dir(target), "source.sock")
	client, err := migrationtls.ClientConfig(nodecert.Issue(t, ca, sourceNode), migrationUID, targetNode)
	if err != nil {
		t.Fatal(err)
	}
	src, err = ListenUnix(ctx, source, DialTLS(dst.Addr().String(), client))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return source, src, dst
}

// listenTarget is node-b's target proxy for migrationUID from node-a, to the unix socket target.
func listenTarget(t *testing.T, ctx context.Context, target string, certs migrationtls.Certificates, refused func(error)) *Proxy {
	t.Helper()
	server, err := migrationtls.ServerConfig(certs, migrationUID, sourceNode)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := ListenTLS(ctx, "127.0.0.1:0", target, server, refused)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dst.Close() })
	return dst
}

// roundTrip sends req through the unix socket at path, half-closes, and reads the answer to its end.
func roundTrip(path string, req []byte) ([]byte, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	if _, err := c.Write(req); err != nil {
		return nil, fmt.Errorf("writing: %w", err)
	}
	if err := c.(*net.UnixConn).CloseWrite(); err != nil {
		return nil, fmt.Errorf("half-closing: %w", err)
	}
	resp, err := io.ReadAll(c)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	return resp, nil
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHalfCloseCarriesTheEndOfEachDirection(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target.sock")
	server(t, target, replyAfterEOF)
	source, _, _ := chain(t, t.Context(), target)

	req := randomBytes(t, 3<<20)
	resp, err := roundTrip(source, req)
	if err != nil {
		t.Fatalf("round trip through the proxies: %v", err)
	}
	want := append([]byte(fmt.Sprintf("%d:", len(req))), req...)
	if !bytes.Equal(resp, want) {
		t.Fatalf("answer is %d bytes, want %d bytes: the request's end or the answer did not pass intact", len(resp), len(want))
	}
}

func TestForwardsManyConnectionsAtOnce(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target.sock")
	server(t, target, replyAfterEOF)
	source, _, _ := chain(t, t.Context(), target)

	const conns = 64
	errs := make(chan error, conns)
	for i := range conns {
		go func() {
			req := bytes.Repeat([]byte{byte(i)}, 64<<10+i)
			resp, err := roundTrip(source, req)
			if err == nil && !bytes.Equal(resp, append([]byte(fmt.Sprintf("%d:", len(req))), req...)) {
				err = fmt.Errorf("connection %d: answer of %d bytes does not match its request", i, len(resp))
			}
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// streamForever writes to the connection until it fails, as a migration that has not ended.
func streamForever(c *net.UnixConn) {
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

func TestCloseDuringTransferEndsEverything(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target.sock")
	server(t, target, streamForever)
	source, src, dst := chain(t, t.Context(), target)

	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("unix", source)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(testTimeout))
		// Data flowing proves the transfer is under way before the proxies close.
		if _, err := io.ReadFull(c, make([]byte, 1<<20)); err != nil {
			t.Fatalf("reading the stream before Close: %v", err)
		}
		clients = append(clients, c)
	}
	if err := src.Close(); err != nil {
		t.Errorf("closing the source proxy: %v", err)
	}
	if err := dst.Close(); err != nil {
		t.Errorf("closing the target proxy: %v", err)
	}
	for i, c := range clients {
		if _, err := io.Copy(io.Discard, c); err != nil && !isClosedError(err) {
			t.Errorf("client %d: reading after Close = %v, want the stream to end", i, err)
		}
	}
	if _, err := os.Lstat(source); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the socket file %s is still there after Close (Lstat error %v)", source, err)
	}
	if c, err := net.Dial("tcp", dst.Addr().String()); err == nil {
		c.Close()
		t.Errorf("the target proxy still accepts connections on %s after Close", dst.Addr())
	}
}

// isClosedError is true for the errors a reader sees when the other side closed rather than half-closed.
func isClosedError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

func TestContextEndClosesTheProxy(t *testing.T) {
	dir := shortDir(t)
	ctx, cancel := context.WithCancel(t.Context())
	path := filepath.Join(dir, "ctx.sock")
	p, err := ListenUnix(ctx, path, func(context.Context) (net.Conn, error) {
		return nil, errors.New("never dialed")
	})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		_, err := os.Lstat(path)
		return errors.Is(err, fs.ErrNotExist), nil
	})
	if err != nil {
		t.Fatalf("the socket %s is still there %s after its context ended", path, testTimeout)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close after the context ended: %v", err)
	}
}

func TestTargetSocketMayAppearLater(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "late.sock")
	source, _, dst := chain(t, t.Context(), target)

	result := make(chan error, 1)
	go func() {
		resp, err := roundTrip(source, []byte("hello"))
		if err == nil && string(resp) != "5:hello" {
			err = fmt.Errorf("answer %q, want %q", resp, "5:hello")
		}
		result <- err
	}()
	// The target proxy holds the connection while its target is missing: it is dialing.
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		return dst.tracked() > 0, nil
	})
	if err != nil {
		t.Fatalf("the target proxy accepted no connection within %s", testTimeout)
	}
	server(t, target, replyAfterEOF)
	if err := <-result; err != nil {
		t.Fatalf("round trip to a target that appeared later: %v", err)
	}
}

func (p *Proxy) tracked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func TestDialUnixRetryGivesUp(t *testing.T) {
	dir := shortDir(t)
	start := time.Now()
	_, err := dialUnixRetry(t.Context(), filepath.Join(dir, "never.sock"), 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dialUnixRetry() of a socket that never appears = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > testTimeout {
		t.Errorf("dialUnixRetry() gave up after %s, want about 200ms", elapsed)
	}
}

func TestUnreachableTargetDropsTheConnection(t *testing.T) {
	dir := shortDir(t)
	source := filepath.Join(dir, "drop.sock")
	p, err := ListenUnix(t.Context(), source, func(context.Context) (net.Conn, error) {
		return nil, errors.New("target node unreachable")
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c, err := net.Dial("unix", source)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("reading a connection whose target could not be dialed = %d bytes, %v; want EOF", n, err)
	}
}

func TestListenUnixReplacesOnlyStaleSockets(t *testing.T) {
	dir := shortDir(t)
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	// A crashed proxy leaves its socket file behind.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	p, err := ListenUnix(t.Context(), stale, func(context.Context) (net.Conn, error) { return nil, errors.New("unused") })
	if err != nil {
		t.Fatalf("ListenUnix() over a stale socket: %v", err)
	}
	_ = p.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(t.Context(), file, nil); err == nil {
		t.Error("ListenUnix() over a regular file succeeded, want an error")
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("the regular file is gone after ListenUnix refused it: %v", err)
	}
}
