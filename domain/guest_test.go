package domain

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

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

// TestWatchCountersSeesAPause: what the benchmarks and the demo report as the time the guest
// stood still (guest.WatchCounters) is at least a pause the test makes, and not much more.
func TestWatchCountersSeesAPause(t *testing.T) {
	c := connect(t, startDaemon(t))
	name, console := runGuest(t, c, guestVMI(t, "paused"))
	ctx := guestContext(t)
	counterAt := func(want string, min int) int {
		t.Helper()
		out, err := guest.WaitForConsole(ctx, console, want, func(out string) bool { return guest.Counter(out) >= min })
		if err != nil {
			t.Fatal(err)
		}
		return guest.Counter(out)
	}
	counterAt("counter 2", 2)
	stop := guest.WatchCounters(ctx, time.Second, func() []string { return []string{console} })
	before := counterAt("one more counter, watched", guest.Counter(readFile(t, console))+1)
	const pause = 3 * time.Second
	if err := c.Suspend(name); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause) // the pause being measured, not a wait for a condition
	if err := c.Resume(name); err != nil {
		t.Fatal(err)
	}
	counterAt("two counters after the pause", before+2)
	seen := stop().Longest
	t.Logf("a %s pause, seen as %s", pause, seen.Round(time.Millisecond))
	if seen < pause-100*time.Millisecond || seen > pause+time.Second {
		t.Errorf("WatchCounters saw the guest stopped for %s; it was paused for %s", seen, pause)
	}
}
