package domain

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

func TestGuestBootsAndCounts(t *testing.T) {
	c := connect(t, startDaemon(t))
	vmi := guestVMI(t, "counts")
	// A qcow2 disk too, so libvirt and QEMU accept DomainXML's disk (the guest ignores it).
	disk := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create (Debian package qemu-utils): %v: %s", err, out)
	}
	vmi.Spec.Boot.Disk = disk
	name, console := runGuest(t, c, vmi)
	ctx := guestContext(t)

	if _, err := guest.WaitForLine(ctx, console, protocol.Ready); err != nil {
		t.Fatal(err)
	}
	if _, err := guest.WaitForConsole(ctx, console, "counter 3", func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n >= 3
	}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Name: "default_counts", UUID: string(vmi.UID), State: Running, Reason: ReasonBooted}
	if info != want {
		t.Errorf("Lookup() = %+v, want %+v", info, want)
	}
	stats, err := c.JobStats(name)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Type != JobNone {
		t.Errorf("JobStats() of a domain with no job = %+v, want type %s", stats, JobNone)
	}
}
