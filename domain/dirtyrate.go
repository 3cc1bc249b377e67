package domain

import (
	"encoding/json"
	"fmt"
	"time"

	"libvirt.org/go/libvirt"
)

// DirtyRateMode is how QEMU measures a guest's dirty rate outside a migration's passes.
type DirtyRateMode string

const (
	// DirtyRatePageSampling hashes a sample of the guest's pages (samplePagesPerGiB) at the
	// start and the end of the period and scales the share that changed: no dirty logging, so
	// it costs the guest nothing and its result can be read while a migration runs.
	DirtyRatePageSampling DirtyRateMode = "page-sampling"
	// DirtyRateBitmap turns on dirty logging for the period, as a migration does, and counts
	// the pages written.
	DirtyRateBitmap DirtyRateMode = "dirty-bitmap"
)

// StartDirtyRateCalc has QEMU measure how fast the named running domain writes its memory over
// period (whole seconds, at least one: libvirt's unit). DirtyRate reads the result. Start it
// before a migration: libvirt makes the call wait while a migration runs, but reading the
// result does not. QEMU measures one thing at a time: when a measurement is running already
// (the agent's warm-up, agent.WarmDirtyRate), the call returns nil and DirtyRate reads that
// one's result.
func (c *Conn) StartDirtyRateCalc(name string, period time.Duration, mode DirtyRateMode) error {
	if mode != DirtyRatePageSampling && mode != DirtyRateBitmap {
		return fmt.Errorf("unknown dirty rate mode %q", mode)
	}
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	secs := max(1, int(period.Round(time.Second)/time.Second))
	if mode == DirtyRatePageSampling {
		err = samplePages(dom, secs)
	} else {
		err = dom.StartDirtyRateCalc(secs, libvirt.DOMAIN_DIRTYRATE_MODE_DIRTY_BITMAP)
	}
	if err != nil {
		if c.measuring(dom) {
			return nil
		}
		return fmt.Errorf("starting to measure the dirty rate of domain %q (%s): %w", name, mode, err)
	}
	return nil
}

// measuring reports whether QEMU is measuring dom's dirty rate now.
func (c *Conn) measuring(dom *libvirt.Domain) bool {
	r, ok, err := c.dirtyRateStats(dom)
	return err == nil && ok && r.CalcStatusSet && libvirt.DomainDirtyRateStatus(r.CalcStatus) == libvirt.DOMAIN_DIRTYRATE_MEASURING
}

// samplePagesPerGiB is how many pages of each GiB of guest memory page sampling hashes.
// QEMU's default, 512 (all libvirt's API asks for), left one-second samples of a 1 GiB guest
// rewriting 32 MiB/s between 22 and 34 MiB/s, and of one rewriting 48 between 45 and 60; with
// 16384 they read 31 to 33 and 45 to 49 (five samples each). TestDirtyRateEstimateMatchesTheGuest
// keeps each sample within an eighth. The hashing is QEMU's sampling thread's, not the
// guest's: a 256 MiB guest's one-second sample was ready 1.06 s after it began, 1.01 s with 512.
const samplePagesPerGiB = 16384

// samplePages starts page sampling through QEMU's monitor (QEMU 6.1 or newer): libvirt's API
// has no parameter for the sample's size. libvirt marks the domain tainted ("custom-monitor")
// for it; nothing else changes, and libvirt reads the result as for a measurement it started
// itself.
func samplePages(dom *libvirt.Domain, secs int) error {
	cmd, err := json.Marshal(map[string]any{"execute": "calc-dirty-rate", "arguments": map[string]any{
		"calc-time": secs, "sample-pages": samplePagesPerGiB, "mode": string(DirtyRatePageSampling)}})
	if err != nil {
		return err
	}
	out, err := dom.QemuMonitorCommand(string(cmd), libvirt.DOMAIN_QEMU_MONITOR_COMMAND_DEFAULT)
	if err != nil {
		return err
	}
	var reply struct {
		Error *struct{ Desc string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		return fmt.Errorf("reading QEMU's reply %q: %w", out, err)
	}
	if reply.Error != nil {
		return fmt.Errorf("QEMU refused: %s", reply.Error.Desc)
	}
	return nil
}

// DirtyRate returns the result of the named domain's last StartDirtyRateCalc in bytes per
// second, and false while QEMU is still measuring (or never did).
func (c *Conn) DirtyRate(name string) (uint64, bool, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return 0, false, err
	}
	defer dom.Free()
	r, ok, err := c.dirtyRateStats(dom)
	if err != nil {
		return 0, false, fmt.Errorf("reading the dirty rate of domain %q: %w", name, err)
	}
	// QEMU marks a measurement running before StartDirtyRateCalc returns, so a measured status
	// is the last start's.
	if !ok || !r.CalcStatusSet || libvirt.DomainDirtyRateStatus(r.CalcStatus) != libvirt.DOMAIN_DIRTYRATE_MEASURED {
		return 0, false, nil
	}
	if !r.MegabytesPerSecondSet {
		return 0, false, fmt.Errorf("QEMU measured the dirty rate of domain %q but reported no rate", name)
	}
	return uint64(max(0, r.MegabytesPerSecond)) << 20, true, nil
}

// dirtyRateStats reads dom's dirty-rate stats; false when libvirt has none.
func (c *Conn) dirtyRateStats(dom *libvirt.Domain) (*libvirt.DomainStatsDirtyRate, bool, error) {
	stats, err := c.virt.GetAllDomainStats([]*libvirt.Domain{dom}, libvirt.DOMAIN_STATS_DIRTYRATE, 0)
	if err != nil {
		return nil, false, err
	}
	for i := range stats {
		_ = stats[i].Domain.Free()
	}
	if len(stats) != 1 || stats[0].DirtyRate == nil {
		return nil, false, nil
	}
	return stats[0].DirtyRate, true, nil
}
