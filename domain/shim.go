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

// shimSpec is what the shim does: bind mounts, then exec of the daemon.
type shimSpec struct {
	Mounts []bindMount `json:"mounts"`
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
		// this leaves an empty directory behind, which nothing else uses.
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return fmt.Errorf("creating mount point: %w", err)
		}
		if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", m.Source, m.Target, err)
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
