package domain

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/domain/reap"
)

// shimEnv carries the shim's instructions (JSON) to the re-executed binary.
const shimEnv = "LIFEBOAT_LIBVIRTD_SHIM"

// shimSpec is what the shim does: bind mounts, then the daemon, as User if set.
type shimSpec struct {
	Mounts []BindMount `json:"mounts"`
	User   *User       `json:"user,omitempty"`
	Binary string      `json:"binary"`
	Args   []string    `json:"args"`
}

// MaybeRunLibvirtdShim turns this process into a private libvirtd's parent if it was started as
// one by StartLibvirtd, and returns at once otherwise. Call it first thing in main (or TestMain)
// of any program that starts a private libvirtd.
//
// Why a re-exec: a mount namespace belongs to a whole process, and a Go program is many
// threads from its start, so the new namespace is made for a fresh child process
// (Unshareflags) that mounts and then starts libvirtd.
func MaybeRunLibvirtdShim() {
	spec, ok := os.LookupEnv(shimEnv)
	if !ok {
		return
	}
	code, err := runShim(spec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lifeboat libvirtd shim: %v\n", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// runShim makes the mounts, starts the daemon, passes SIGTERM and SIGINT on to it and returns its
// exit code once it has exited. It stays as the daemon's parent and as its processes' subreaper,
// as a pod's pause process is for a launcher's: libvirtd daemonizes QEMU, whose parent then
// becomes the nearest subreaper, and libvirt takes a QEMU that has exited but is not reaped for
// alive. Without a subreaper that is the machine's init, which may reap late (this development
// machine's every 2 s): a migration's source then waited 1.1 to 2 s for its QEMU to be seen gone
// before the migration returned.
func runShim(specJSON string) (int, error) {
	var spec shimSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return 0, fmt.Errorf("reading $%s: %w", shimEnv, err)
	}
	// Go's Unshareflags already made mounts private; repeat it so that no bind mount below
	// can propagate to the host however this process was started.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return 0, fmt.Errorf("making mounts private: %w", err)
	}
	for _, m := range spec.Mounts {
		// The mount point must exist; on a machine without libvirt's system directories
		// this leaves an empty directory behind, which nothing else uses. A file (a device
		// node) is mounted only over an existing one.
		if fi, err := os.Stat(m.Source); err == nil && fi.IsDir() {
			if err := os.MkdirAll(m.Target, 0o755); err != nil {
				return 0, fmt.Errorf("creating mount point: %w", err)
			}
		}
		if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return 0, fmt.Errorf("bind-mounting %s on %s: %w", m.Source, m.Target, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return 0, fmt.Errorf("becoming the daemon's subreaper: %w", err)
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	env := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, shimEnv+"=") {
			env = append(env, e)
		}
	}
	// The daemon dies with the thread that started it (its parent-death signal): this one,
	// which stays locked and alive until the shim exits.
	runtime.LockOSThread()
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if u := spec.User; u != nil {
		// Leaving root for another user clears every capability.
		attr.Credential = &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: []uint32{uint32(u.GID)}}
	}
	pid, err := syscall.ForkExec(spec.Binary, append([]string{spec.Binary}, spec.Args...),
		&syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}, Sys: attr})
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", spec.Binary, err)
	}
	go func() {
		for s := range signals {
			_ = syscall.Kill(pid, s.(syscall.Signal))
		}
	}()
	return reap.Until(pid)
}
