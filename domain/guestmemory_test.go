package domain

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// Of a QEMU's mappings, the anonymous, non-executable one of the guest's memory size is the
// guest's RAM: not the translated code's buffer of the same size, a file's mapping or the heap.
func TestMappingResident(t *testing.T) {
	const gib = 1 << 30
	smaps := `7f0000000000-7f0040000000 rw-p 00000000 00:00 0 
Size:            1048576 kB
Rss:              300000 kB
Anonymous:        300000 kB
7f0040000000-7f0080000000 rwxp 00000000 00:00 0 
Size:            1048576 kB
Rss:               90000 kB
Anonymous:         90000 kB
55d000000000-55d040000000 rw-p 00000000 fd:01 1234                       /var/lib/a-file-of-a-gibibyte
Size:            1048576 kB
Rss:                4000 kB
Anonymous:             0 kB
55d041000000-55d043000000 rw-p 00000000 00:00 0                          [heap]
Size:              32768 kB
Rss:               20000 kB
Anonymous:         20000 kB
VmFlags: rd wr mr mw me ac sd 
`
	if got, err := mappingResident(strings.NewReader(smaps), gib); err != nil || got != 300000<<10 {
		t.Errorf("mappingResident = %d, %v; want %d", got, err, 300000<<10)
	}
	for _, tc := range []struct{ name, smaps string }{
		{"no mapping of that size", strings.Replace(smaps, "Size:            1048576 kB\nRss:              300000", "Size:            1048572 kB\nRss:              300000", 1)},
		{"two of that size", smaps + "7f0080000000-7f00c0000000 rw-p 00000000 00:00 0 \nSize:            1048576 kB\nRss:                  12 kB\n"},
		{"nothing", ""},
	} {
		if _, err := mappingResident(strings.NewReader(tc.smaps), gib); !errors.Is(err, errNoGuestRAM) {
			t.Errorf("%s: mappingResident error %v, want errNoGuestRAM", tc.name, err)
		}
	}
	if _, err := mappingResident(strings.NewReader("7f0000000000-7f0040000000 rw-p 00000000 00:00 0\nSize: 1048576 kB\nRss: lots kB\n"), gib); err == nil {
		t.Error("a malformed figure: want an error")
	}
}

// A 128 MiB guest that wrote 64 MiB has that much and at most its memory resident by this count,
// far less than its QEMU process's resident set, which counts QEMU's own memory besides.
func TestGuestMemoryResidentCountsTheGuestsMemoryNotQEMUsCode(t *testing.T) {
	d := startDaemon(t)
	c := connect(t, d)
	vmi := guestVMI(t, "resident", protocol.DirtyParam+"=64M", protocol.DirtyRateParam+"=1M")
	name, console := runGuest(t, c, vmi)
	if _, err := guest.WaitForLine(guestContext(t), console, protocol.Ready); err != nil {
		t.Fatal(err)
	}
	size, err := c.MemorySize(name)
	if err != nil || size != 128<<20 {
		t.Fatalf("MemorySize = %d, %v; want the VMI's 128 MiB", size, err)
	}
	got, err := d.GuestMemoryResident(name, size)
	if err != nil {
		t.Fatal(err)
	}
	rss, err := processRSS(qemuPid(t, d, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest memory resident %d MiB, QEMU's resident set %d MiB", got>>20, rss>>20)
	if got < 64<<20 || got > 128<<20 || got+32<<20 > rss {
		t.Errorf("guest memory resident %d MiB: want at least the 64 MiB the guest wrote, at most its 128 MiB, and at least 32 MiB below QEMU's resident set, %d MiB", got>>20, rss>>20)
	}
}

// processRSS is VmRSS of /proc/pid/status, in bytes.
func processRSS(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kib, err := strconv.ParseUint(f[1], 10, 64)
			return kib << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
