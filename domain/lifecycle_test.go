package domain

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// waitEvent reads events until one of domain has type want, and returns it.
func waitEvent(ctx context.Context, events <-chan Event, domain string, want EventType) (Event, error) {
	var seen []Event
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return Event{}, fmt.Errorf("the event stream ended before a %s event of %s; seen: %+v", want, domain, seen)
			}
			seen = append(seen, e)
			if e.Domain == domain && e.Type == want {
				return e, nil
			}
		case <-ctx.Done():
			return Event{}, fmt.Errorf("waiting for a %s event of %s: %w; seen: %+v", want, domain, ctx.Err(), seen)
		}
	}
}

func TestACPIShutdownPowersTheGuestOff(t *testing.T) {
	c := connect(t, startDaemon(t))
	ctx := guestContext(t)
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name, console := runGuest(t, c, guestVMI(t, "acpi"))

	started, err := waitEvent(ctx, events, name, EventStarted)
	if err != nil {
		t.Fatal(err)
	}
	if started.State != Running || started.Reason != ReasonBooted {
		t.Errorf("Started event = %+v, want state %s reason %s", started, Running, ReasonBooted)
	}
	// The guest reads the power button only once it is ready; a press before would be lost.
	if _, err := guest.WaitForLine(ctx, console, protocol.Ready); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(name); err != nil {
		t.Fatal(err)
	}
	if _, err := guest.WaitForLine(ctx, console, protocol.PowerButton); err != nil {
		t.Fatal(err)
	}
	shutdown, err := waitEvent(ctx, events, name, EventShutdown)
	if err != nil {
		t.Fatal(err)
	}
	if shutdown.State != ShuttingDown {
		t.Errorf("Shutdown event = %+v, want state %s", shutdown, ShuttingDown)
	}
	stopped, err := waitEvent(ctx, events, name, EventStopped)
	if err != nil {
		t.Fatal(err)
	}
	if stopped.State != Shutoff || stopped.Reason != ReasonShutdown {
		t.Errorf("Stopped event = %+v, want state %s reason %s", stopped, Shutoff, ReasonShutdown)
	}
	type stateReason struct {
		State  State
		Reason Reason
	}
	got := kubewait.For(t, time.Minute, "domain "+name+" shut off", func(context.Context) (stateReason, error) {
		state, reason, err := c.State(name)
		return stateReason{state, reason}, err
	}, func(s stateReason) bool { return s.State == Shutoff }, nil)
	if got.Reason != ReasonShutdown {
		t.Errorf("State() reason = %s, want %s", got.Reason, ReasonShutdown)
	}
}

func TestDestroyStopsTheGuestAtOnce(t *testing.T) {
	c := connect(t, startDaemon(t))
	ctx := guestContext(t)
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := runGuest(t, c, guestVMI(t, "destroy"))
	if _, err := waitEvent(ctx, events, name, EventStarted); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(name); err != nil {
		t.Fatal(err)
	}
	stopped, err := waitEvent(ctx, events, name, EventStopped)
	if err != nil {
		t.Fatal(err)
	}
	if stopped.Reason != ReasonDestroyed {
		t.Errorf("Stopped event = %+v, want reason %s", stopped, ReasonDestroyed)
	}
	state, reason, err := c.State(name)
	if err != nil {
		t.Fatal(err)
	}
	if state != Shutoff || reason != ReasonDestroyed {
		t.Errorf("State() = %s, %s, want %s, %s", state, reason, Shutoff, ReasonDestroyed)
	}
	if err := c.Destroy(name); err == nil {
		t.Error("Destroy() of a stopped domain succeeded, want an error")
	}
	if _, err := c.Lookup("default_nothing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup() of a missing domain = %v, want ErrNotFound", err)
	}
}

func TestGracefulShutdownRecordSurvivesReconnect(t *testing.T) {
	d := startDaemon(t)
	c := connect(t, d)
	vmi := guestVMI(t, "metadata")
	name, _ := runGuest(t, c, vmi)

	m, err := c.Metadata(name)
	if err != nil {
		t.Fatal(err)
	}
	if m.Namespace != vmi.Namespace || m.Name != vmi.Name || m.UID != string(vmi.UID) || m.GracefulShutdown != nil {
		t.Fatalf("Metadata() of a new domain = %+v, want the VMI %s/%s %s and no graceful shutdown", m, vmi.Namespace, vmi.Name, vmi.UID)
	}
	signal := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	want := GracefulShutdown{SignalTime: signal, Deadline: signal.Add(30 * time.Second)}
	if err := c.SetGracefulShutdown(name, want); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// A new connection, as a restarted agent would open.
	c2 := connect(t, d)
	check := func(when string) {
		t.Helper()
		m, err := c2.Metadata(name)
		if err != nil {
			t.Fatal(err)
		}
		if m.UID != string(vmi.UID) || m.GracefulShutdown == nil ||
			!m.GracefulShutdown.SignalTime.Equal(want.SignalTime) || !m.GracefulShutdown.Deadline.Equal(want.Deadline) {
			t.Errorf("%s: Metadata() = %+v (graceful shutdown %+v), want graceful shutdown %+v", when, m, m.GracefulShutdown, want)
		}
	}
	check("after reconnecting")
	// The persistent definition has it too, so a stopped and restarted domain keeps it.
	if err := c2.Destroy(name); err != nil {
		t.Fatal(err)
	}
	check("in the persistent definition")
}

func TestTwoDaemonsEachRunAGuest(t *testing.T) {
	type instance struct {
		daemon  *Libvirtd
		conn    *Conn
		name    string
		console string
	}
	var instances []instance
	for _, vmName := range []string{"first", "second"} {
		d := startDaemon(t)
		c := connect(t, d)
		name, console := runGuest(t, c, guestVMI(t, vmName))
		instances = append(instances, instance{daemon: d, conn: c, name: name, console: console})
	}
	ctx := guestContext(t)
	for _, in := range instances {
		if _, err := guest.WaitForLine(ctx, in.console, protocol.Ready); err != nil {
			t.Fatal(err)
		}
	}
	// Each daemon has only its own domain.
	if _, err := instances[0].conn.Lookup(instances[1].name); !errors.Is(err, ErrNotFound) {
		t.Errorf("the first daemon looked up the second's domain: %v, want ErrNotFound", err)
	}
	if _, err := instances[1].conn.Lookup(instances[0].name); !errors.Is(err, ErrNotFound) {
		t.Errorf("the second daemon looked up the first's domain: %v, want ErrNotFound", err)
	}

	// Stopping one daemon takes its QEMU along and leaves the other guest running.
	qemu := qemuPid(t, instances[0].daemon, instances[0].name)
	if err := instances[0].daemon.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-instances[0].daemon.Done():
	default:
		t.Error("libvirtd still runs after Stop returned")
	}
	if isQEMU(qemu) {
		t.Errorf("QEMU %d of the stopped daemon still runs", qemu)
	}
	before, _ := protocol.LastCounter(readFile(t, instances[1].console))
	if _, err := guest.WaitForConsole(ctx, instances[1].console, fmt.Sprintf("a counter after %d", before), func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n > before
	}); err != nil {
		t.Fatal(err)
	}
	if state, _, err := instances[1].conn.State(instances[1].name); err != nil || state != Running {
		t.Errorf("the other daemon's guest: state %s, error %v; want %s", state, err, Running)
	}
}

// TestTheDaemonLoadsOnlyQEMUsDriver: a private libvirtd maps QEMU's connection driver and no
// other (networks, storage pools, node devices, secrets, host interfaces and filters are not
// lifeboat's, and each driver costs every VM's daemon memory), and still runs a guest.
func TestTheDaemonLoadsOnlyQEMUsDriver(t *testing.T) {
	if qemuDriverModule() == "" {
		t.Fatalf("libvirt's QEMU driver module is in none of %v", qemuDriverGlobs)
	}
	d := startDaemon(t)
	c := connect(t, d)
	_, console := runGuest(t, c, guestVMI(t, "one-driver"))
	if _, err := guest.WaitForLine(guestContext(t), console, protocol.Ready); err != nil {
		t.Fatal(err)
	}
	mapped := readFile(t, fmt.Sprintf("/proc/%d/maps", daemonPid(t, d)))
	loaded := map[string]bool{}
	for _, line := range strings.Split(mapped, "\n") {
		if f := strings.Fields(line); len(f) == 6 && strings.HasPrefix(filepath.Base(f[5]), "libvirt_driver_") {
			loaded[filepath.Base(f[5])] = true
		}
	}
	if want := map[string]bool{"libvirt_driver_qemu.so": true}; !maps.Equal(loaded, want) {
		t.Errorf("libvirtd maps the connection drivers %v, want only %v", slices.Sorted(maps.Keys(loaded)), slices.Sorted(maps.Keys(want)))
	}
}

// A root caller's daemon runs under the shim, which stays its parent and the subreaper of what
// it starts, as a pod's pause process is for a launcher's: libvirtd daemonizes QEMU, and takes a
// QEMU that has exited but is not reaped for alive. Without a subreaper the machine's init adopts
// QEMU, and reaps when it will (this development machine's every 2 s): each stopped or migrated
// domain was seen gone that much later.
func TestTheShimAdoptsTheDaemonsQEMU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (make test and .ci/run run as root): only a root caller's daemons run under the shim; a non-root caller's daemon is started without it")
	}
	d := startDaemon(t)
	c := connect(t, d)
	ctx := guestContext(t)
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := runGuest(t, c, guestVMI(t, "adopted"))
	if _, err := waitEvent(ctx, events, name, EventStarted); err != nil {
		t.Fatal(err)
	}
	pid := qemuPid(t, d, name)
	stat := readFile(t, fmt.Sprintf("/proc/%d/stat", pid))
	// The parent is the fourth field; the second, the command, is in parentheses and may hold spaces.
	var state string
	var ppid int
	if _, err := fmt.Sscan(stat[strings.LastIndex(stat, ")")+1:], &state, &ppid); err != nil {
		t.Fatalf("reading QEMU's parent from %q: %v", stat, err)
	}
	if shim := d.Pid(); ppid != shim || shim == daemonPid(t, d) {
		t.Errorf("QEMU %d's parent is %d, want the daemon's shim %d (the daemon is %d)", pid, ppid, shim, daemonPid(t, d))
	}

	// Reaped, not only adopted: once destroyed, QEMU's process is gone well inside init's 2 s,
	// rather than lingering as a zombie that libvirtd takes for a running QEMU.
	if err := c.Destroy(name); err != nil {
		t.Fatal(err)
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if errors.Is(err, fs.ErrNotExist) {
			return true, nil
		}
		last = string(b)
		return false, nil
	})
	if err != nil {
		t.Errorf("QEMU %d still in the process table 1 s after Destroy, want it reaped by the shim at once; last /proc/%d/stat: %q", pid, pid, last)
	}
}
