package domain

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GuestMemoryResident is how much of the guest's RAM (size bytes, the VMI's memory) the QEMU of
// the named domain has resident: the resident size of its one anonymous, non-executable mapping of
// exactly that size (/proc/PID/smaps), where QEMU keeps the RAM of a memory-backend-ram. The
// process's resident set counts QEMU's own memory besides (under TCG, over 100 MiB of translated
// code and its structures), which is no part of what a migration sends. Guest memory the host
// swapped out is not in it.
func (d *Libvirtd) GuestMemoryResident(name string, size uint64) (uint64, error) {
	pid, err := d.QEMUPid(name)
	if err != nil {
		return 0, err
	}
	path := filepath.Join("/proc", strconv.Itoa(pid), "smaps")
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("reading QEMU's memory mappings: %w", err)
	}
	defer f.Close()
	rss, err := mappingResident(f, size)
	if err != nil {
		return 0, fmt.Errorf("the guest's RAM in %s: %w", path, err)
	}
	return rss, nil
}

// errNoGuestRAM: no mapping, or more than one, fits the guest's RAM.
var errNoGuestRAM = errors.New("no single anonymous mapping of the guest's memory size")

// mappingResident reads smaps for the Rss, in bytes, of the one anonymous, non-executable
// mapping of size bytes.
func mappingResident(r io.Reader, size uint64) (uint64, error) {
	var found, candidate bool
	var rss uint64
	s := bufio.NewScanner(r)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		switch {
		case len(fields) == 5 && strings.Contains(fields[0], "-") && len(fields[1]) == 4:
			// An anonymous mapping's header (a file's has a sixth field, its path): address range,
			// permissions (rwxp), offset, device, inode.
			candidate = fields[1][2] != 'x' && fields[4] == "0"
		case len(fields) >= 5:
			candidate = false
		case candidate && len(fields) == 3 && fields[2] == "kB" && (fields[0] == "Size:" || fields[0] == "Rss:"):
			kib, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("line %q: %w", s.Text(), err)
			}
			if fields[0] == "Size:" {
				candidate = kib<<10 == size
				continue
			}
			if found {
				return 0, errNoGuestRAM
			}
			found, rss = true, kib<<10
		}
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, errNoGuestRAM
	}
	return rss, nil
}
