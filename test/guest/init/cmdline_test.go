package main

import (
	"net/netip"
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		name    string
		cmdline string
		want    params
		errs    int
	}{
		{name: "nothing for init", cmdline: "console=ttyS0 quiet\n", want: params{}},
		{name: "dirty only", cmdline: "console=ttyS0 lifeboat.dirty=64M", want: params{dirty: 64 << 20}},
		{name: "dirty at a rate", cmdline: "lifeboat.dirty=64M lifeboat.dirtyrate=8M\n", want: params{dirty: 64 << 20, dirtyRate: 8 << 20}},
		{name: "bad size is reported and ignored", cmdline: "lifeboat.dirty=lots lifeboat.dirtyrate=1M", want: params{}, errs: 2},
		{name: "rate without memory", cmdline: "lifeboat.dirtyrate=1M", want: params{}, errs: 1},
		{name: "key without value", cmdline: "lifeboat.dirty", want: params{}, errs: 1},
		{name: "disk writes", cmdline: "lifeboat.diskrate=4M lifeboat.diskspan=256M", want: params{diskRate: 4 << 20, diskSpan: 256 << 20}},
		{name: "disk writes over one block at least", cmdline: "lifeboat.diskrate=4M", want: params{diskRate: 4 << 20, diskSpan: 1 << 20}},
		{name: "a finer tick", cmdline: "lifeboat.tick=50ms", want: params{tick: 50 * time.Millisecond}},
		{name: "spoofing towards an address", cmdline: "lifeboat.spoof=192.0.2.1:9", want: params{spoof: netip.MustParseAddrPort("192.0.2.1:9")}},
		{name: "spoofing needs an IPv4 address and a port", cmdline: "lifeboat.spoof=192.0.2.1 lifeboat.spoof=[fd00::1]:9", want: params{}, errs: 2},
		{name: "bad tick is reported and ignored", cmdline: "lifeboat.tick=-1s lifeboat.tick=often", want: params{}, errs: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := parseCmdline(tt.cmdline)
			if got != tt.want {
				t.Errorf("parseCmdline() = %+v, want %+v", got, tt.want)
			}
			if len(errs) != tt.errs {
				t.Errorf("parseCmdline() errors = %v, want %d", errs, tt.errs)
			}
		})
	}
}
