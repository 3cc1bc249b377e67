package agent

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/domain"
)

// QEMUCapabilities gives each launcher that asks a copy of the QEMU capabilities that the
// node's prober wrote at path (lifeboat-launcher probe-qemu, run by the agent's pod with the
// launchers' image as their user), so that the launcher's libvirtd starts without probing QEMU.
// The file is read at each request: the prober may finish after the agent starts.
//
// The copy is a memory file of the launcher's own: nothing it does to it reaches the node's
// file or another launcher. Nothing goes the other way: a launcher's libvirt runs beside a
// guest that may have taken over its QEMU, and a file from there could tell every libvirt
// on the node what to believe of QEMU.
func QEMUCapabilities(path string) func() (*os.File, error) {
	return func() (*os.File, error) {
		src, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("the node's QEMU capabilities are not probed (no %s)", path)
		}
		if err != nil {
			return nil, err
		}
		defer src.Close()
		fd, err := unix.MemfdCreate("qemu-capabilities", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("a memory file for the QEMU capabilities: %w", err)
		}
		f := os.NewFile(uintptr(fd), "qemu-capabilities")
		n, err := io.Copy(f, io.LimitReader(src, domain.MaxQEMUCapabilities+1))
		if err == nil && n > domain.MaxQEMUCapabilities {
			err = fmt.Errorf("%s is larger than %d bytes", path, domain.MaxQEMUCapabilities)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
}
