package agent

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/agent/podsocket"
)

// A relay takes the admitted process's connections only, and at most maxRelayedPairs of them at
// once: a libvirt client child that a hostile daemon took over cannot spend the agent's file
// descriptors by connecting without end. A connection that ends frees its place.
func TestALibvirtRelayTakesItsChildsConnectionsWithinItsBound(t *testing.T) {
	// Short paths: a unix socket's path holds 107 bytes.
	root, err := os.MkdirTemp("", "relay")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	launcher := filepath.Join(root, "launcher.sock")
	ln, err := net.Listen("unix", launcher)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	target, err := podsocket.Open(launcher)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	r, err := newLibvirtRelay(filepath.Join(root, "relays"), target)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Cut()

	// relayed reports whether a connection to the relay reaches the launcher's socket.
	relayed := func() (net.Conn, bool) {
		t.Helper()
		c, err := net.Dial("unix", r.Path())
		if err != nil {
			t.Fatal(err)
		}
		select {
		case up := <-accepted:
			t.Cleanup(func() { up.Close() })
			return c, true
		case <-time.After(2 * time.Second):
			// Turned away: the relay closed it.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Fatalf("a connection the relay did not take: %v; want it closed", err)
			}
			c.Close()
			return nil, false
		}
	}
	if _, ok := relayed(); ok {
		t.Fatal("the relay took a connection before it admitted any process")
	}
	r.admit(os.Getpid())
	var held []net.Conn
	for i := range maxRelayedPairs {
		c, ok := relayed()
		if !ok {
			t.Fatalf("the relay turned away connection %d of %d", i+1, maxRelayedPairs)
		}
		held = append(held, c)
	}
	if _, ok := relayed(); ok {
		t.Fatalf("the relay took connection %d, over its bound", maxRelayedPairs+1)
	}
	held[0].Close()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return r.open() < maxRelayedPairs, nil
	}); err != nil {
		t.Fatal("a connection that ended still holds its place after 5 s")
	}
	if _, ok := relayed(); !ok {
		t.Fatal("the place freed by a connection that ended was not taken again")
	}
	for _, c := range held[1:] {
		c.Close()
	}
	if fi, err := os.Stat(filepath.Join(root, "relays")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the relays' directory: %v, %v; want it root's alone (0700)", fi, err)
	}
}
