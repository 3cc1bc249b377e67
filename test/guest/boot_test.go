package guest

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// TestGuestBootsCountsDirtiesAndPowersOff boots the image in QEMU itself (no libvirt,
// which package domain tests with it), under TCG as lifeboat's tests do everywhere.
func TestGuestBootsCountsDirtiesAndPowersOff(t *testing.T) {
	img, err := ensure()
	if err != nil {
		t.Fatal(err)
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatalf("booting the guest needs qemu-system-x86_64 (Debian package qemu-system-x86): %v", err)
	}
	dir := t.TempDir()
	console := filepath.Join(dir, "console.log")
	monitor := filepath.Join(dir, "monitor.sock")
	cmd := exec.Command(qemu,
		"-machine", "q35,accel=tcg", "-m", "128", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		"-append", Cmdline+" "+protocol.DirtyParam+"=16M "+protocol.DirtyRateParam+"=4M",
		"-serial", "file:"+console,
		"-monitor", "unix:"+monitor+",server=on,wait=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() {
		exitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := WaitForLine(ctx, console, protocol.Ready)
	if err != nil {
		t.Fatal(err)
	}
	if want := protocol.Dirtying(16<<20, 4<<20); !HasLine(out, want) {
		t.Errorf("the guest did not say %q before it was ready; console:\n%s", want, out)
	}
	if _, err := WaitForConsole(ctx, console, "counter 2", func(c string) bool {
		n, ok := protocol.LastCounter(c)
		return ok && n >= 2
	}); err != nil {
		t.Fatal(err)
	}

	conn, err := net.Dial("unix", monitor)
	if err != nil {
		t.Fatalf("connecting to the QEMU monitor: %v", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("system_powerdown\n")); err != nil {
		t.Fatalf("pressing the power button: %v", err)
	}
	if _, err := WaitForLine(ctx, console, protocol.PowerButton); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if exitErr != nil {
			t.Errorf("QEMU exited with %v after the guest powered off, want success", exitErr)
		}
	case <-ctx.Done():
		t.Fatal("the guest printed its power-button line but QEMU did not exit: the guest did not power off")
	}
}
