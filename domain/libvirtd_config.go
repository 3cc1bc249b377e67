package domain

import (
	"fmt"
	"path/filepath"
	"strings"
)

// bindMount is a directory of a private daemon mounted over a system path in its namespace.
type bindMount struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// daemonLayout is where a private daemon keeps everything, under one directory.
type daemonLayout struct {
	dir       string
	socketDir string
	// capsCache, if not empty, is a directory shared by the node's daemons for libvirt's
	// QEMU capabilities cache.
	capsCache string
}

func (l daemonLayout) confDir() string    { return filepath.Join(l.dir, "etc") }
func (l daemonLayout) runDir() string     { return filepath.Join(l.dir, "run") }
func (l daemonLayout) libDir() string     { return filepath.Join(l.dir, "lib") }
func (l daemonLayout) logDir() string     { return filepath.Join(l.dir, "log") }
func (l daemonLayout) cacheDir() string   { return filepath.Join(l.dir, "cache") }
func (l daemonLayout) confFile() string   { return filepath.Join(l.confDir(), "libvirtd.conf") }
func (l daemonLayout) qemuConf() string   { return filepath.Join(l.confDir(), "qemu.conf") }
func (l daemonLayout) pidFile() string    { return filepath.Join(l.dir, "libvirtd.pid") }
func (l daemonLayout) daemonLog() string  { return filepath.Join(l.dir, "libvirtd.log") }
func (l daemonLayout) socket() string     { return filepath.Join(l.socketDir, "libvirt-sock") }
func (l daemonLayout) qemuPidDir() string { return filepath.Join(l.runDir(), "qemu") }

// capsCacheTarget is where libvirt keeps its QEMU capabilities cache, under /var/cache/libvirt.
const capsCacheTarget = "/var/cache/libvirt/qemu/capabilities"

// dirs are the directories to create before the daemon starts. libvirtd does not create
// the QEMU log directory it needs with stdio_handler = "file".
func (l daemonLayout) dirs() []string {
	dirs := []string{l.confDir(), l.runDir(), l.libDir(), filepath.Join(l.logDir(), "qemu"), l.cacheDir(), l.socketDir}
	if l.capsCache != "" {
		dirs = append(dirs, l.capsCache)
	}
	return dirs
}

// mounts are the bind mounts that give the daemon its own libvirt system paths, so that
// several daemons run side by side as if each had the machine to itself.
//
// A shared capabilities cache is mounted last, inside the daemon's own cache. libvirt probes a
// QEMU binary's capabilities (several seconds under TCG) the first time a daemon uses it, and a
// migration target's daemon first uses it in the middle of the migration; with the cache the
// node's first launcher pays once. libvirt checks a cached entry against the QEMU and libvirt
// binaries' change times, the kernel and the CPU, and probes again if any differs.
func (l daemonLayout) mounts() []bindMount {
	mounts := []bindMount{
		{Source: l.confDir(), Target: "/etc/libvirt"},
		{Source: l.runDir(), Target: "/run/libvirt"},
		{Source: l.libDir(), Target: "/var/lib/libvirt"},
		{Source: l.logDir(), Target: "/var/log/libvirt"},
		{Source: l.cacheDir(), Target: "/var/cache/libvirt"},
	}
	if l.capsCache != "" {
		mounts = append(mounts, bindMount{Source: l.capsCache, Target: capsCacheTarget})
	}
	return mounts
}

// libvirtdConf is the daemon's libvirtd.conf. Its own host UUID keeps daemons apart
// (migration refuses a destination with the source's UUID). The sockets are root's only
// (0700) and so need no further authentication.
func libvirtdConf(socketDir, hostUUID string) string {
	return confFile(
		"unix_sock_dir", quote(socketDir),
		"unix_sock_ro_perms", quote("0700"),
		"unix_sock_rw_perms", quote("0700"),
		"auth_unix_ro", quote("none"),
		"auth_unix_rw", quote("none"),
		"host_uuid", quote(hostUUID),
		"log_outputs", quote("3:stderr"),
	)
}

// qemuConf is the daemon's qemu.conf, what libvirt's QEMU driver needs in a VM pod: QEMU
// runs as root without a security driver or cgroup management (the pod's cgroup already
// holds it), and QEMU's own output goes to a file rather than through virtlogd.
func qemuConf() string {
	return confFile(
		"security_driver", quote("none"),
		"stdio_handler", quote("file"),
		"cgroup_controllers", "[ ]",
		"user", quote("root"),
		"group", quote("root"),
	)
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
