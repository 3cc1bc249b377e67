package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// ProbeQEMU does what the agent's pod does on a real node before its agent starts: it runs
// launcherBinary's probe-qemu in a container of the launchers' user, and returns the file it
// wrote in dir, for the agents' --qemu-capabilities. Every emulated node is this machine, so one
// probe serves all. The calling program must call MaybeRunShim, as every one that starts nodes does.
func ProbeQEMU(ctx context.Context, launcherBinary, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Chown(dir, contract.UID, contract.GID); err != nil {
		return "", err
	}
	user := credentials{UID: contract.UID, GID: contract.GID, Groups: []uint32{contract.GID}, NoNewPrivs: true}
	records, err := userRecords(user, filepath.Join(dir, "etc"))
	if err != nil {
		return "", err
	}
	out, logPath := filepath.Join(dir, "qemu-capabilities.xml"), filepath.Join(dir, "probe-qemu.log")
	proc, err := startProcess(shimSpec{
		Path: launcherBinary, Args: []string{"lifeboat-launcher", "probe-qemu", "--out", out},
		Env: []string{"PATH=" + defaultPath, "HOME=/root", "TMPDIR=" + dir}, Dir: "/", Mounts: records, User: user,
	}, logPath)
	if err != nil {
		return "", fmt.Errorf("lifeboat-launcher probe-qemu: %w", err)
	}
	select {
	case <-proc.done:
	case <-ctx.Done():
		proc.signal(syscall.SIGKILL)
		<-proc.done
	}
	if _, err := os.Stat(out); err != nil {
		log, _ := os.ReadFile(logPath)
		return "", fmt.Errorf("lifeboat-launcher probe-qemu wrote no capabilities (exit code %d): %w\n%s", proc.exitCode, err, log)
	}
	return out, nil
}
