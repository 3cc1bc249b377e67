package domain

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/apimachinery/pkg/util/wait"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// killQEMUs kills the QEMU processes whose pid files libvirt left in dir and waits until
// they are gone.
func killQEMUs(dir string) error {
	pidFiles, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range pidFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err != nil || !isQEMU(pid) {
			continue
		}
		slog.Info("killing a QEMU left behind by libvirtd", "pid", pid, "pidfile", f)
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("killing QEMU %d: %w", pid, err))
			continue
		}
		if err := waitGone(pid, stopTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isQEMU reports whether pid is a live QEMU, so that a stale pid file never makes Stop
// kill a process that reused the pid.
func isQEMU(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && strings.Contains(filepath.Base(exe), "qemu-system")
}

func waitGone(pid int, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || processState(string(stat)) == 'Z', nil
	})
	if err != nil {
		return fmt.Errorf("QEMU %d still runs %s after SIGKILL", pid, timeout)
	}
	return nil
}

// processState is the state letter of /proc/<pid>/stat ("R", "S", "Z", ...), which
// follows the command name in parentheses (which may itself hold parentheses).
func processState(stat string) byte {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}
