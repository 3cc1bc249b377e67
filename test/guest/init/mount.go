package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mountFilesystems mounts what init reads: /proc for the command line and memory figures,
// /sys for the input devices, and devtmpfs on /dev so the kernel creates the
// /dev/input/event* nodes of the drivers init loads.
func mountFilesystems() error {
	mounts := []struct{ source, target, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
	}
	var errs []error
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("mounting %s on %s: %w", m.fstype, m.target, err))
		}
	}
	return errors.Join(errs...)
}
