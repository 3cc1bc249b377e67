package domain

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// A launcher's daemon given the capabilities another daemon on the node probed loads them
// without probing QEMU itself; given a file that is no longer true of the machine (another
// QEMU binary's change time), it probes as it would have without one, and still serves.
func TestADaemonStartsWithAnotherDaemonsQEMUCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("runs daemons as the launchers' user (107), which needs root: run the tests as root, as make test and .ci/run do (README, Prerequisites)")
	}
	root, err := os.MkdirTemp("", "qemucaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil { // the daemons' user reaches their directories
		t.Fatal(err)
	}
	user := &User{UID: contract.UID, GID: contract.GID}
	load := func(d *Libvirtd) {
		t.Helper()
		c, err := Connect(d.Socket())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.LoadQEMUCapabilities(); err != nil {
			t.Fatal(err)
		}
	}

	prober := startDaemonConfig(t, Config{Dir: filepath.Join(root, "prober"), User: user})
	load(prober)
	caps, err := prober.QEMUCapabilities()
	if err != nil {
		t.Fatalf("the probing daemon's capabilities cache: %v", err)
	}

	// A file libvirt rewrites gets a new modification time; one it takes as it is keeps ours.
	long := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	startWith := func(name string, caps []byte) (*Libvirtd, string) {
		t.Helper()
		dir := filepath.Join(root, name)
		cfg := Config{Dir: dir, User: user, QEMUCapabilities: caps}
		layout, err := layoutFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		file, err := qemuCapsName(caps)
		if err != nil {
			t.Fatal(err)
		}
		d := startDaemonConfig(t, cfg)
		path := filepath.Join(layout.qemuCapsDir(), file)
		if err := os.Chtimes(path, long, long); err != nil {
			t.Fatalf("the daemon was not started with the capabilities file: %v", err)
		}
		return d, path
	}

	given, path := startWith("given", caps)
	load(given)
	if fi, err := os.Stat(path); err != nil || !fi.ModTime().Equal(long) {
		t.Fatalf("the daemon given the capabilities rewrote them (probed QEMU again): %v, %v", fi.ModTime(), err)
	}

	stale := regexp.MustCompile(`<qemuctime>\d+</qemuctime>`).ReplaceAll(bytes.Clone(caps), []byte("<qemuctime>1</qemuctime>"))
	staleDaemon, stalePath := startWith("stale", stale)
	load(staleDaemon)
	if fi, err := os.Stat(stalePath); err != nil || fi.ModTime().Equal(long) {
		t.Fatalf("the daemon given stale capabilities did not probe QEMU again: %v", err)
	}
}

func TestQEMUCapsName(t *testing.T) {
	for _, tc := range []struct {
		caps, want string
	}{
		// What libvirt names the cache of /usr/bin/qemu-system-x86_64.
		{"<qemuCaps>\n  <emulator>/usr/bin/qemu-system-x86_64</emulator>\n</qemuCaps>", "926803a9278e445ec919c2b6cbd8c1c449c75b26dcb1686b774314180376c725.xml"},
		{"<qemuCaps><emulator>qemu-system-x86_64</emulator></qemuCaps>", ""},
		{"<qemuCaps><emulator>/usr/bin/../bin/qemu</emulator></qemuCaps>", ""},
		{"<other><emulator>/usr/bin/qemu</emulator></other>", ""},
		{"<qemuCaps><machine><emulator>/usr/bin/qemu</emulator></machine></qemuCaps>", ""},
		{"<qemuCaps><qemuctime>1</qemuctime></qemuCaps>", ""},
		{"not xml", ""},
	} {
		got, err := qemuCapsName([]byte(tc.caps))
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("qemuCapsName(%q) = %q, %v; want %q", tc.caps, got, err, tc.want)
		}
	}
}

// What naming a capabilities file of libvirt 9.0's size (about 100 KiB) costs a launcher at its
// start, with the emulator first as libvirt writes it.
func BenchmarkQEMUCapsName(b *testing.B) {
	var caps bytes.Buffer
	caps.WriteString("<qemuCaps>\n  <emulator>/usr/bin/qemu-system-x86_64</emulator>\n")
	for i := 0; caps.Len() < 100<<10; i++ {
		fmt.Fprintf(&caps, "  <flag name='feature-%d'/>\n", i)
	}
	caps.WriteString("</qemuCaps>\n")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := qemuCapsName(caps.Bytes()); err != nil {
			b.Fatal(err)
		}
	}
}
