package soak

import (
	"strconv"
	"strings"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// ParseConsole reads a console log: its last counter line (a reboot shows as the counter going
// back), the longest journal it said was intact, and its disk error lines up to the guest's power
// button: once the guest powers off, a journal write racing its kernel's shutdown fails (EIO), and
// that write was never committed.
func ParseConsole(console string) (counter, through int, errs []string) {
	lines := strings.Split(strings.ReplaceAll(console, "\r\n", "\n"), "\n")
	poweringOff := false
	for _, line := range lines {
		if n, ok := strings.CutPrefix(line, protocol.CounterPrefix); ok {
			if v, err := strconv.Atoi(n); err == nil {
				counter = v
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, protocol.DiskPrefix); ok {
			if _, journal, ok := strings.Cut(rest, ": journal 1.."); ok {
				if v, err := strconv.Atoi(strings.TrimSuffix(journal, " intact")); err == nil {
					through = v
				}
			}
			continue
		}
		if strings.TrimRight(line, "\r") == protocol.PowerButton {
			poweringOff = true
		}
		if rest, ok := strings.CutPrefix(line, protocol.ErrorPrefix); ok && strings.HasPrefix(rest, "disk ") && !poweringOff {
			errs = append(errs, rest)
		}
	}
	return counter, through, errs
}
