package domain

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestProbeKVM boots the test guest under KVM. Whether it prints depends on the machine
// (on nested KVM like lifeboat's CI it hangs and the probe says false); what must hold
// everywhere is that the probe answers within its timeout and leaves no domain behind.
func TestProbeKVM(t *testing.T) {
	img := testImage(t)
	c := connect(t, startDaemon(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	start := time.Now()
	ok, err := ProbeKVM(ctx, c, img.Kernel, img.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("ProbeKVM() = %v after %s", ok, took.Round(time.Millisecond))
	// The first domain of a new daemon waits for libvirt to probe QEMU's capabilities.
	if took > probeTimeout+30*time.Second {
		t.Errorf("ProbeKVM() took %s, want at most about %s", took, probeTimeout)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil && ok {
		t.Errorf("ProbeKVM() = true on a machine without /dev/kvm")
	}
	expectNoDomains(t, c)
}

// TestTheProbeSeesAGuestThatPrints shows the probe's positive answer, which the machine decides
// for KVM: the same boot under TCG, which runs Linux everywhere, is seen printing.
func TestTheProbeSeesAGuestThatPrints(t *testing.T) {
	img := testImage(t)
	c := connect(t, startDaemon(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	printed, startErr, err := bootPrints(ctx, c, TCG, img.Kernel, img.Initrd)
	if err != nil || startErr != nil {
		t.Fatalf("bootPrints(TCG) = %v, start error %v, error %v; want a TCG guest to start", printed, startErr, err)
	}
	if !printed {
		t.Errorf("bootPrints(TCG) = false: a TCG guest printed nothing on its console within %s, want true", probeTimeout)
	}
	expectNoDomains(t, c)
}

func expectNoDomains(t *testing.T, c *Conn) {
	t.Helper()
	domains, err := c.virt.ListAllDomains(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range domains {
		name, _ := d.GetName()
		t.Errorf("the probe left domain %q behind", name)
		d.Free()
	}
}

// The probe's verdict is what the guest's console shows: a guest that prints (here a console
// written to, as QEMU writes a kernel's first lines) proves KVM; one silent until the timeout does not.
func TestTheProbeAcceptsAGuestThatPrintsOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	printing := filepath.Join(t.TempDir(), "console.log")
	// The guest's first line comes a moment after the probe starts watching, as after a boot.
	late := time.AfterFunc(300*time.Millisecond, func() { _ = os.WriteFile(printing, []byte("Linux version 6.1.0\n"), 0o644) })
	defer late.Stop()
	if ok, err := consolePrinted(ctx, printing, 5*time.Second); err != nil || !ok {
		t.Errorf("consolePrinted() on a console that gets a line = %v, %v; want true", ok, err)
	}
	silent := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(silent, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := consolePrinted(ctx, silent, 500*time.Millisecond); err != nil || ok {
		t.Errorf("consolePrinted() on a silent console = %v, %v; want false", ok, err)
	}
	cancelled, stop := context.WithCancel(ctx)
	stop()
	if _, err := consolePrinted(cancelled, silent, time.Second); err == nil {
		t.Error("consolePrinted() with its context ended: want an error")
	}
}

func TestResolveAccelerationKeepsExplicitChoices(t *testing.T) {
	for _, a := range []Acceleration{KVM, TCG} {
		// No probe runs for an explicit choice, so no connection is needed.
		got, err := ResolveAcceleration(context.Background(), nil, a, "", "")
		if err != nil || got != a {
			t.Errorf("ResolveAcceleration(%s) = %s, %v, want %s", a, got, err, a)
		}
	}
	if _, err := ResolveAcceleration(context.Background(), nil, "fast", "", ""); err == nil {
		t.Error("ResolveAcceleration(fast) succeeded, want an error")
	}
}
