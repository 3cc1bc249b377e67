package main

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// params are the kernel command-line parameters init acts on.
type params struct {
	dirty     int64 // bytes of memory to allocate and write
	dirtyRate int64 // bytes per second of that memory to keep rewriting
	diskRate  int64 // bytes per second to write to the first writable disk
	diskSpan  int64 // bytes of that disk the writes go round
	tick      time.Duration
	spoof     netip.AddrPort // where to send the datagrams of protocol.SpoofParam
}

// parseCmdline reads init's parameters from the kernel command line. Bad values are
// reported and ignored, so one typo does not cost the guest its counter.
func parseCmdline(cmdline string) (params, []error) {
	var p params
	var errs []error
	for _, field := range strings.Fields(cmdline) {
		key, value, _ := strings.Cut(field, "=")
		var into *int64
		switch key {
		case protocol.TickParam:
			tick, err := time.ParseDuration(value)
			if err != nil || tick <= 0 {
				errs = append(errs, fmt.Errorf("%s: %q is not a positive duration", key, value))
				continue
			}
			p.tick = tick
			continue
		case protocol.SpoofParam:
			to, err := netip.ParseAddrPort(value)
			if err != nil || !to.Addr().Is4() {
				errs = append(errs, fmt.Errorf("%s: %q is not an IPv4 address and port", key, value))
				continue
			}
			p.spoof = to
			continue
		case protocol.DirtyParam:
			into = &p.dirty
		case protocol.DirtyRateParam:
			into = &p.dirtyRate
		case protocol.DiskRateParam:
			into = &p.diskRate
		case protocol.DiskSpanParam:
			into = &p.diskSpan
		default:
			continue
		}
		size, err := protocol.ParseSize(value)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
			continue
		}
		*into = size
	}
	if p.dirtyRate > 0 && p.dirty == 0 {
		errs = append(errs, fmt.Errorf("%s needs %s: there is no memory to rewrite", protocol.DirtyRateParam, protocol.DirtyParam))
		p.dirtyRate = 0
	}
	if p.diskRate > 0 && p.diskSpan < protocol.DiskBlock {
		p.diskSpan = protocol.DiskBlock
	}
	return p, errs
}
