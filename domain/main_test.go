package domain

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
)

func TestMain(m *testing.M) {
	// The private daemons the tests start are this test binary, re-executed.
	MaybeRunLibvirtdShim()
	os.Exit(m.Run())
}

// testImage is the test guest, built once per test binary.
var testImage = func() func(t *testing.T) guest.Image {
	build := sync.OnceValues(func() (guest.Image, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		return guest.Ensure(ctx, os.Stderr)
	})
	return func(t *testing.T) guest.Image {
		t.Helper()
		img, err := build()
		if err != nil {
			t.Fatalf("building the test guest: %v", err)
		}
		return img
	}
}()

// startDaemon starts a private libvirtd in a temporary directory, stopped when the test ends.
func startDaemon(t *testing.T) *Libvirtd {
	t.Helper()
	return startDaemonConfig(t, Config{Dir: t.TempDir()})
}

// startDaemonConfig starts a private libvirtd for cfg, stopped when the test ends.
func startDaemonConfig(t *testing.T, cfg Config) *Libvirtd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := StartLibvirtd(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stopping libvirtd: %v", err)
		}
	})
	return d
}

// connect opens a connection to d, closed when the test ends.
func connect(t *testing.T, d *Libvirtd) *Conn {
	t.Helper()
	c, err := Connect(d.Socket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// guestVMI is a VMI that boots the test guest with 128 MiB and extra kernel parameters.
func guestVMI(t *testing.T, name string, params ...string) *v1alpha1.VirtualMachineInstance {
	img := testImage(t)
	cmdline := guest.Cmdline
	for _, p := range params {
		cmdline += " " + p
	}
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uuid.NewString())},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs:   1,
			Memory: resource.MustParse("128Mi"),
			Boot:   v1alpha1.BootSource{Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: cmdline},
		},
	}
}

// runGuest starts vmi under TCG on c and returns its domain name and console log.
func runGuest(t *testing.T, c *Conn, vmi *v1alpha1.VirtualMachineInstance) (name, console string) {
	t.Helper()
	console = t.TempDir() + "/console.log"
	xml, err := DomainXML(vmi, XMLOptions{Acceleration: TCG, ConsoleLog: console})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DefineAndStart(xml); err != nil {
		t.Fatal(err)
	}
	return DomainName(vmi.Namespace, vmi.Name), console
}

// guestTimeout bounds waits on a guest under TCG, on a machine shared with other work.
const guestTimeout = 2 * time.Minute

func guestContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// qemuPid is the pid of the QEMU running the named domain of d.
func qemuPid(t *testing.T, d *Libvirtd, name string) int {
	t.Helper()
	pid, err := d.QEMUPid(name)
	if err != nil {
		t.Fatalf("the QEMU of %s: %v", name, err)
	}
	if !isQEMU(pid) {
		t.Fatalf("pid %d of domain %s is not a running QEMU", pid, name)
	}
	return pid
}

// daemonPid is the pid of d's libvirtd (a root caller's daemon is the child of its shim,
// whose pid is d.Pid()).
func daemonPid(t *testing.T, d *Libvirtd) int {
	t.Helper()
	pid, err := d.DaemonPid()
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
