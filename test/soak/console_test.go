package soak

import (
	"fmt"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

func TestParseConsole(t *testing.T) {
	for _, tc := range []struct {
		name          string
		console       string
		counter, jrnl int
		errs          string
	}{
		{"nothing yet", "", 0, 0, "[]"},
		{"counting with a journal", "lifeboat-guest ready\r\nlifeboat-guest counter 1\r\nlifeboat-guest counter 2\r\n" +
			protocol.Journal("vda", 5) + "\r\nlifeboat-guest counter 6\r\n", 6, 5, "[]"},
		{"a reboot shows as the last counter going back", "lifeboat-guest counter 41\r\nlifeboat-guest counter 1\r\n", 1, 0, "[]"},
		{"a journal error", "lifeboat-guest counter 3\r\n" + protocol.ErrorPrefix + "disk vda: journal entry 2 holds 0, want 2\r\n", 3,
			0, "[disk vda: journal entry 2 holds 0, want 2]"},
		{"an error that is not the disk's", protocol.ErrorPrefix + "network: no DHCP answer\r\n", 0, 0, "[]"},
		{"a write racing the guest's own power-off is no loss", "lifeboat-guest counter 3\r\n" + protocol.PowerButton + "\r\n" +
			protocol.ErrorPrefix + "disk vda: write /dev/vda: input/output error\r\n", 3, 0, "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter, jrnl, errs := ParseConsole(tc.console)
			if counter != tc.counter || jrnl != tc.jrnl || fmt.Sprint(errs) != tc.errs {
				t.Errorf("got counter %d, journal %d, errors %v; want %d, %d, %s", counter, jrnl, errs, tc.counter, tc.jrnl, tc.errs)
			}
		})
	}
}
