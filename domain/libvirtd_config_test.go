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
		`unix_sock_rw_perms = "0770"`,
	} {
		if !strings.Contains(conf, line+"\n") {
			t.Errorf("libvirtd.conf has no line %q:\n%s", line, conf)
		}
	}
}

func TestQEMUConf(t *testing.T) {
	common := []string{`security_driver = "none"`, `stdio_handler = "file"`, `cgroup_controllers = [ ]`}
	system, session := qemuConf(false), qemuConf(true)
	for _, line := range append(common, `user = "root"`, `group = "root"`) {
		if !strings.Contains(system, line+"\n") {
			t.Errorf("a system daemon's qemu.conf has no line %q:\n%s", line, system)
		}
	}
	for _, line := range common {
		if !strings.Contains(session, line+"\n") {
			t.Errorf("a session daemon's qemu.conf has no line %q:\n%s", line, session)
		}
	}
	// A session daemon runs QEMU as its own user; naming another is an error there.
	if strings.Contains(session, "user =") || strings.Contains(session, "group =") {
		t.Errorf("a session daemon's qemu.conf names a user or group:\n%s", session)
	}
}

func TestSessionDaemonLayout(t *testing.T) {
	l := daemonLayout{dir: "/p/libvirt", socketDir: "/p", session: true}
	env := map[string]string{}
	for _, kv := range l.env() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	// libvirt reads qemu.conf from $XDG_CONFIG_HOME/libvirt and writes QEMU's pid files under
	// $XDG_RUNTIME_DIR/libvirt/qemu/run; everything stays under the daemon's directory.
	if got, want := l.qemuConf(), env["XDG_CONFIG_HOME"]+"/libvirt/qemu.conf"; got != want {
		t.Errorf("qemu.conf is written at %s, but a session daemon reads %s", got, want)
	}
	if got, want := l.qemuPidDir(), env["XDG_RUNTIME_DIR"]+"/libvirt/qemu/run"; got != want {
		t.Errorf("QEMU pid files are looked for in %s, but a session daemon writes them in %s", got, want)
	}
	for _, k := range []string{"HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"} {
		if !strings.HasPrefix(env[k], "/p/libvirt/") {
			t.Errorf("$%s = %q, want a directory under the daemon's /p/libvirt", k, env[k])
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
