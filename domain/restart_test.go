package domain

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// TestARestartedDaemonKeepsItsGuest: a private libvirtd killed outright (SIGKILL, as the OOM
// killer or a crash ends it) and restarted finds the guest its predecessor ran still running, in
// the same QEMU, and serves it on a fresh connection; the guest notices nothing (no reboot, its
// counter goes on).
func TestARestartedDaemonKeepsItsGuest(t *testing.T) {
	d := startDaemon(t)
	c := connect(t, d)
	name, console := runGuest(t, c, guestVMI(t, "survivor"))
	ctx := guestContext(t)
	out, err := guest.WaitForConsole(ctx, console, "counter 2", func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n >= 2
	})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := protocol.LastCounter(out)
	qemu := qemuPid(t, d, name)

	if err := syscall.Kill(daemonPid(t, d), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-ctx.Done():
		t.Fatal("libvirtd did not exit on SIGKILL")
	}
	if !isQEMU(qemu) {
		t.Fatalf("QEMU %d died with its daemon", qemu)
	}
	started := time.Now()
	restartCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.Restart(restartCtx); err != nil {
		t.Fatal(err)
	}
	t.Logf("libvirtd restarted in %s", time.Since(started).Round(time.Millisecond))

	// A fresh connection: the old one went with the old daemon.
	c2 := connect(t, d)
	if state, reason, err := c2.State(name); err != nil || state != Running {
		t.Fatalf("after the restart the domain is %s (%s), error %v; want %s", state, reason, err, Running)
	}
	if got := qemuPid(t, d, name); got != qemu {
		t.Errorf("after the restart the domain runs in QEMU %d, want the same QEMU %d", got, qemu)
	}
	out, err = guest.WaitForConsole(ctx, console, fmt.Sprintf("counter %d", before+3), func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n >= before+3
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, protocol.Ready); n != 1 {
		t.Errorf("the console shows %q %d times, want once: the guest rebooted", protocol.Ready, n)
	}
	// The restarted daemon still commands the guest (its monitor connection is back).
	if err := c2.Suspend(name); err != nil {
		t.Fatalf("suspending the guest through the restarted daemon: %v", err)
	}
	if err := c2.Resume(name); err != nil {
		t.Fatalf("resuming the guest through the restarted daemon: %v", err)
	}
}
