package domain

import (
	"fmt"
	"path/filepath"
	"strings"
)

// BindMount is a file or directory mounted over a path in a private daemon's mount namespace.
type BindMount struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// daemonLayout is where a private daemon keeps everything, under one directory.
//
// A daemon runs in the mode of its caller. A non-root caller (the launcher in its unprivileged
// pod) gets a session daemon, which keeps everything under the directories its environment
// names (XDG_*, HOME) and needs no privilege at all. libvirtd as root always runs in system
// mode, with fixed system paths; a root caller (the domain tests, the migration-pair
// benchmark on one machine) gets those paths from bind mounts in a private mount namespace.
type daemonLayout struct {
	dir       string
	socketDir string
	session   bool
	// driverModule is libvirt's QEMU driver module, the one connection driver the daemon loads
	// (qemuDriverModule); "" loads every driver the daemon finds.
	driverModule string
}

// qemuDriverGlobs are where distributions install libvirt's QEMU driver module (Debian's
// multiarch directory, or lib64 and lib).
var qemuDriverGlobs = []string{
	"/usr/lib/*/libvirt/connection-driver/libvirt_driver_qemu.so",
	"/usr/lib*/libvirt/connection-driver/libvirt_driver_qemu.so",
}

// qemuDriverModule is libvirt's QEMU driver module on this machine, "" if it is in none of the
// places qemuDriverGlobs name. libvirtd loads and starts every connection driver module in its
// directory (networks, storage pools, node devices, secrets, host interfaces, filters); a
// lifeboat daemon uses QEMU's alone, and given a directory with only that module
// (LIBVIRT_DRIVER_DIR) each VM's libvirtd holds 2.7 MiB less resident memory, 0.9 MiB of it its
// own (measured at b6f0095 with BenchmarkDensity, one run before against three after), and none
// of the other drivers' code.
func qemuDriverModule() string {
	for _, g := range qemuDriverGlobs {
		if m, _ := filepath.Glob(g); len(m) > 0 {
			return m[0]
		}
	}
	return ""
}

// driverDir is the daemon's connection driver directory, with driverModule alone in it.
func (l daemonLayout) driverDir() string { return filepath.Join(l.dir, "drivers") }

func (l daemonLayout) confDir() string {
	if l.session {
		return filepath.Join(l.configHome(), "libvirt")
	}
	return filepath.Join(l.dir, "etc")
}

func (l daemonLayout) runDir() string     { return filepath.Join(l.dir, "run") }
func (l daemonLayout) libDir() string     { return filepath.Join(l.dir, "lib") }
func (l daemonLayout) logDir() string     { return filepath.Join(l.dir, "log") }
func (l daemonLayout) cacheDir() string   { return filepath.Join(l.dir, "cache") }
func (l daemonLayout) configHome() string { return filepath.Join(l.dir, "config") }
func (l daemonLayout) home() string       { return filepath.Join(l.dir, "home") }
func (l daemonLayout) confFile() string   { return filepath.Join(l.confDir(), "libvirtd.conf") }
func (l daemonLayout) qemuConf() string   { return filepath.Join(l.confDir(), "qemu.conf") }
func (l daemonLayout) pidFile() string    { return filepath.Join(l.dir, "libvirtd.pid") }
func (l daemonLayout) daemonLog() string  { return filepath.Join(l.dir, "libvirtd.log") }
func (l daemonLayout) socket() string     { return filepath.Join(l.socketDir, "libvirt-sock") }

// qemuPidDir is where libvirt's QEMU driver writes a pid file per running domain:
// <runtime dir>/libvirt/qemu/run in session mode, /run/libvirt/qemu in system mode.
func (l daemonLayout) qemuPidDir() string {
	if l.session {
		return filepath.Join(l.runDir(), "libvirt", "qemu", "run")
	}
	return filepath.Join(l.runDir(), "qemu")
}

// dirs are the directories to create before the daemon starts. libvirtd does not create
// the QEMU log directory it needs with stdio_handler = "file", nor its socket directory.
func (l daemonLayout) dirs() []string {
	dirs := []string{l.confDir(), l.runDir(), l.cacheDir(), l.socketDir}
	if l.session {
		dirs = append(dirs, l.home())
	} else {
		dirs = append(dirs, l.libDir(), filepath.Join(l.logDir(), "qemu"))
	}
	if l.driverModule != "" {
		dirs = append(dirs, l.driverDir())
	}
	return dirs
}

// env is what the daemon is told: its connection driver directory and, for a session daemon,
// its directories (libvirt, through GLib, takes its configuration, runtime, cache and data
// directories from these).
func (l daemonLayout) env() []string {
	var env []string
	if l.driverModule != "" {
		env = append(env, "LIBVIRT_DRIVER_DIR="+l.driverDir())
	}
	if !l.session {
		return env
	}
	return append(env,
		"HOME="+l.home(),
		"XDG_CONFIG_HOME="+l.configHome(),
		"XDG_RUNTIME_DIR="+l.runDir(),
		"XDG_CACHE_HOME="+l.cacheDir(),
		"XDG_DATA_HOME="+filepath.Join(l.home(), "data"),
		"XDG_STATE_HOME="+filepath.Join(l.home(), "state"),
	)
}

// mounts are the bind mounts that give a system daemon its own libvirt system paths, so that
// several daemons run side by side as if each had the machine to itself.
func (l daemonLayout) mounts() []BindMount {
	return []BindMount{
		{Source: l.confDir(), Target: "/etc/libvirt"},
		{Source: l.runDir(), Target: "/run/libvirt"},
		{Source: l.libDir(), Target: "/var/lib/libvirt"},
		{Source: l.logDir(), Target: "/var/log/libvirt"},
		{Source: l.cacheDir(), Target: "/var/cache/libvirt"},
	}
}

// libvirtdConf is the daemon's libvirtd.conf. Its own host UUID keeps daemons apart
// (migration refuses a destination with the source's UUID). The sockets are the daemon's
// user's and group's only (0770), and so need no further authentication: the node's agent
// joins the launchers' group rather than override file permissions.
func libvirtdConf(socketDir, hostUUID string) string {
	return confFile(
		"unix_sock_dir", quote(socketDir),
		"unix_sock_ro_perms", quote("0770"),
		"unix_sock_rw_perms", quote("0770"),
		"auth_unix_ro", quote("none"),
		"auth_unix_rw", quote("none"),
		"host_uuid", quote(hostUUID),
		"log_outputs", quote("3:stderr"),
	)
}

// qemuConf is the daemon's qemu.conf, what libvirt's QEMU driver needs in a VM pod: no
// security driver or cgroup management (the pod's cgroup already holds QEMU), and QEMU's own
// output goes to a file rather than through virtlogd. A session daemon runs QEMU as its own
// user; a system daemon is told to keep it as root, as this root-only mode has no other user.
func qemuConf(session bool) string {
	kv := []string{
		"security_driver", quote("none"),
		"stdio_handler", quote("file"),
		"cgroup_controllers", "[ ]",
	}
	if !session {
		kv = append(kv, "user", quote("root"), "group", quote("root"))
	}
	return confFile(kv...)
}

// confFile writes key = value lines; values are already in libvirt's config syntax.
func confFile(kv ...string) string {
	var b strings.Builder
	b.WriteString("# Written by lifeboat for one VM's private libvirtd.\n")
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "%s = %s\n", kv[i], kv[i+1])
	}
	return b.String()
}

// quote writes a libvirt config string, which has no escapes: StartLibvirtd refuses paths with quotes.
func quote(s string) string { return `"` + s + `"` }
