package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// ProbeQEMU does what the agent's pod does on a real node before the agent starts: it runs
// launcherBinary's probe-qemu as the launchers' user and returns the file it wrote in dir, for
// the agents' --qemu-capabilities. Every emulated node is this machine, so one probe serves all.
func ProbeQEMU(ctx context.Context, launcherBinary, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Chown(dir, contract.UID, contract.GID); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "qemu-capabilities.xml")
	// Executed through a descriptor opened here, as the node's shim runs a container's binary:
	// the launchers' user may not reach the binary's directory (a checkout under /root).
	binary, err := os.OpenFile(launcherBinary, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer binary.Close()
	var log bytes.Buffer
	cmd := exec.CommandContext(ctx, "/proc/self/fd/3", "probe-qemu", "--out", out)
	cmd.Args[0] = "lifeboat-launcher"
	cmd.ExtraFiles = []*os.File{binary}
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "TMPDIR=" + dir}
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: contract.UID, Gid: contract.GID, Groups: []uint32{contract.GID}}}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("lifeboat-launcher probe-qemu: %w\n%s", err, log.String())
	}
	if _, err := os.Stat(out); err != nil {
		return "", fmt.Errorf("lifeboat-launcher probe-qemu wrote no capabilities: %w\n%s", err, log.String())
	}
	return out, nil
}
