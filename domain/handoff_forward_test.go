package domain

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestAHandOffSaysWhenItsForwardWasClosed: a hand-off that finds the socket to the destination
// gone (the source's agent removed its forward after recording the migration) says so with
// ErrForwardClosed, which a launcher logs as the end of a migration; a socket that is still
// there but answers nobody (its agent restarted) is a failure it reports as one.
func TestAHandOffSaysWhenItsForwardWasClosed(t *testing.T) {
	c := testDriver(t)
	const name = "handoff-forward"
	if err := c.DefineAndStart(testDomainXML(t, name, Metadata{Namespace: "ns", Name: "vm", UID: "u"})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy(name) })
	// Paused at the switch-over, as a migration made with PausedOnArrival leaves the source.
	if err := c.Suspend(name); err != nil {
		t.Fatal(err)
	}
	// The source's QEMU has ended: a process that has exited and been reaped.
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		socket string
		closed bool
	}{
		{filepath.Join(dir, "gone.sock"), true},
		{stale, false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := HandOff(ctx, c, name, ended.Process.Pid, SocketURI(tc.socket, true))
		cancel()
		if err == nil {
			t.Errorf("hand-off through %s = %s, want an error: nothing answers there", filepath.Base(tc.socket), r)
			continue
		}
		if got := errors.Is(err, ErrForwardClosed); got != tc.closed {
			t.Errorf("hand-off through %s: %v; ErrForwardClosed %v, want %v", filepath.Base(tc.socket), err, got, tc.closed)
		}
	}
}
