// Package guest provides the Linux guest that lifeboat's tests boot: Debian's cloud kernel
// and an initrd whose /init (package init beside this one) prints on the serial console,
// dirties memory at a chosen rate and powers off on the ACPI power button.
//
// The image is built on first use and cached, so test packages running in parallel share
// one download and one build.
package guest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/lifeboat-vm/lifeboat/test/internal/cache"
)

// Image is a bootable test guest: paths of a kernel and an initrd for direct kernel boot.
type Image struct {
	Kernel string
	Initrd string
}

// Cmdline is the kernel command line the guest is meant to boot with: the serial console
// is its only output, and quiet keeps the kernel's boot messages out of it, so the console
// log holds the guest's own lines; no_timer_check skips the kernel's check that the timer
// interrupt arrives through the IO-APIC, which a TCG guest on a loaded host can fail ("IO-APIC +
// timer doesn't work!", a panic at boot; seen with a clean-clone CI beside other tests). Append
// protocol.DirtyParam and protocol.DirtyRateParam to dirty memory.
const Cmdline = "console=ttyS0 quiet no_timer_check"

// Ensure returns the test guest image, building what is missing first: the kernel is
// fetched from Debian with apt-get download (nothing is installed on the host) and the
// initrd is built from the init sources. progress receives a line per step that takes time.
//
// It must run inside the lifeboat module (as tests do), because it builds init with go build.
func Ensure(ctx context.Context, progress io.Writer) (Image, error) {
	dir, err := cacheDir()
	if err != nil {
		return Image{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Image{}, fmt.Errorf("creating the guest cache: %w", err)
	}
	kernel, err := ensureKernel(ctx, dir, progress)
	if err != nil {
		return Image{}, err
	}
	initrd, err := ensureInitrd(ctx, dir, kernel, progress)
	if err != nil {
		return Image{}, err
	}
	return Image{Kernel: kernel.vmlinuz(), Initrd: initrd}, nil
}

// cacheDir is where the image is kept: guest/ in the harness's cache, beside the control
// plane's binaries.
func cacheDir() (string, error) {
	root, err := cache.Dir()
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(filepath.Join(root, "guest"))
	if err != nil {
		return "", fmt.Errorf("finding the guest cache: %w", err)
	}
	return abs, nil
}
