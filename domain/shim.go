package domain

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// shimEnv carries the shim's instructions (JSON) to the re-executed binary.
const shimEnv = "LIFEBOAT_LIBVIRTD_SHIM"

// shimSpec is what the shim does: bind mounts, then exec of the daemon, as User if set.
type shimSpec struct {
	Mounts []BindMount `json:"mounts"`
	User   *User       `json:"user,omitempty"`
	Binary string      `json:"binary"`
	Args   []string    `json:"args"`
}

// MaybeRunLibvirtdShim turns this process into a private libvirtd if it was started as
// one by StartLibvirtd, and returns at once otherwise. Call it first thing in main (or
// TestMain) of any program that starts a private libvirtd.
//
// Why a re-exec: a mount namespace belongs to a whole process, and a Go program is many
// threads from its start, so the new namespace is made for a fresh child process
// (Unshareflags) that mounts and then becomes libvirtd.
func MaybeRunLibvirtdShim() {
	spec, ok := os.LookupEnv(shimEnv)
	if !ok {
		return
	}
	err := runShim(spec)
	// runShim returns only when it failed.
	fmt.Fprintf(os.Stderr, "lifeboat libvirtd shim: %v\n", err)
	os.Exit(1)
}

func runShim(specJSON string) error {
	var spec shimSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("reading $%s: %w", shimEnv, err)
	}
	// Go's Unshareflags already made mounts private; repeat it so that no bind mount below
	// can propagate to the host however this process was started.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	for _, m := range spec.Mounts {
		// The mount point must exist; on a machine without libvirt's system directories
		// this leaves an empty directory behind, which nothing else uses. A file (a device
		// node) is mounted only over an existing one.
		if fi, err := os.Stat(m.Source); err == nil && fi.IsDir() {
			if err := os.MkdirAll(m.Target, 0o755); err != nil {
				return fmt.Errorf("creating mount point: %w", err)
			}
		}
		if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", m.Source, m.Target, err)
		}
	}
	if u := spec.User; u != nil {
		if err := dropTo(*u); err != nil {
			return err
		}
	}
	env := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, shimEnv+"=") {
			env = append(env, e)
		}
	}
	if err := syscall.Exec(spec.Binary, append([]string{spec.Binary}, spec.Args...), env); err != nil {
		return fmt.Errorf("executing %s: %w", spec.Binary, err)
	}
	return nil
}

// dropTo makes this process u's, with u's group as its only one, and no capabilities left.
func dropTo(u User) error {
	if err := syscall.Setgroups([]int{u.GID}); err != nil {
		return fmt.Errorf("setting the daemon's groups: %w", err)
	}
	if err := syscall.Setgid(u.GID); err != nil {
		return fmt.Errorf("setting the daemon's group: %w", err)
	}
	if err := syscall.Setuid(u.UID); err != nil {
		return fmt.Errorf("setting the daemon's user: %w", err)
	}
	// A change of user clears the parent-death signal: set it again, so that the daemon still
	// dies with its owner.
	return unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
}
