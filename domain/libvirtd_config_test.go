package domain

import (
	"strings"
	"testing"
)

func TestLibvirtdConf(t *testing.T) {
	conf := libvirtdConf("/run/lifeboat/domains/u1", "6a3e6a52-56b1-4f8c-8f1d-3a64a1f1d2a9")
	for _, line := range []string{
		`unix_sock_dir = "/run/lifeboat/domains/u1"`,
		`host_uuid = "6a3e6a52-56b1-4f8c-8f1d-3a64a1f1d2a9"`,
		`auth_unix_rw = "none"`,
		`unix_sock_rw_perms = "0700"`,
	} {
		if !strings.Contains(conf, line+"\n") {
			t.Errorf("libvirtd.conf has no line %q:\n%s", line, conf)
		}
	}
}

func TestQEMUConf(t *testing.T) {
	conf := qemuConf()
	for _, line := range []string{
		`security_driver = "none"`,
		`stdio_handler = "file"`,
		`cgroup_controllers = [ ]`,
		`user = "root"`,
		`group = "root"`,
	} {
		if !strings.Contains(conf, line+"\n") {
			t.Errorf("qemu.conf has no line %q:\n%s", line, conf)
		}
	}
}

func TestDaemonLayout(t *testing.T) {
	l, err := layoutFor(Config{Dir: "/var/lib/lifeboat/u1", SocketDir: "/run/lifeboat/domains/u1"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.socket(), "/run/lifeboat/domains/u1/libvirt-sock"; got != want {
		t.Errorf("socket = %s, want %s", got, want)
	}
	targets := map[string]string{}
	for _, m := range l.mounts() {
		if !strings.HasPrefix(m.Source, "/var/lib/lifeboat/u1/") {
			t.Errorf("mount source %s is outside the daemon's directory", m.Source)
		}
		targets[m.Target] = m.Source
	}
	for _, target := range []string{"/etc/libvirt", "/run/libvirt", "/var/lib/libvirt", "/var/log/libvirt", "/var/cache/libvirt"} {
		if _, ok := targets[target]; !ok {
			t.Errorf("no private directory is mounted over %s", target)
		}
	}
	if l.qemuPidDir() != targets["/run/libvirt"]+"/qemu" {
		t.Errorf("QEMU pid files are looked for in %s, but libvirt writes them in %s/qemu", l.qemuPidDir(), targets["/run/libvirt"])
	}

	// A shared capabilities cache is mounted after, so inside, the daemon's own cache.
	l, err = layoutFor(Config{Dir: "/d", CapabilitiesCache: "/run/lifeboat/qemu-capabilities"})
	if err != nil {
		t.Fatal(err)
	}
	mounts := l.mounts()
	if last := mounts[len(mounts)-1]; last != (bindMount{Source: "/run/lifeboat/qemu-capabilities", Target: "/var/cache/libvirt/qemu/capabilities"}) {
		t.Errorf("the last mount is %+v, want the shared capabilities cache over libvirt's", last)
	}

	l, err = layoutFor(Config{Dir: "/d"})
	if err != nil || l.socket() != "/d/libvirt-sock" {
		t.Errorf("layoutFor() without a socket directory: socket %s, error %v; want /d/libvirt-sock", l.socket(), err)
	}
	for _, bad := range []Config{{}, {Dir: `/a"b`}, {Dir: "/d", SocketDir: "/s\n"}} {
		if _, err := layoutFor(bad); err == nil {
			t.Errorf("layoutFor(%+v) succeeded, want an error", bad)
		}
	}
}
