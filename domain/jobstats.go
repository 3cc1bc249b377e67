package domain

import (
	"fmt"
	"runtime"
	"time"

	"libvirt.org/go/libvirt"
)

// JobType is the kind of a domain's current (or last) job, such as a migration.
type JobType string

const (
	JobNone      JobType = "None"
	JobBounded   JobType = "Bounded"
	JobUnbounded JobType = "Unbounded"
	JobCompleted JobType = "Completed"
	JobFailed    JobType = "Failed"
	JobCancelled JobType = "Cancelled"
)

var jobTypes = map[libvirt.DomainJobType]JobType{
	libvirt.DOMAIN_JOB_NONE:      JobNone,
	libvirt.DOMAIN_JOB_BOUNDED:   JobBounded,
	libvirt.DOMAIN_JOB_UNBOUNDED: JobUnbounded,
	libvirt.DOMAIN_JOB_COMPLETED: JobCompleted,
	libvirt.DOMAIN_JOB_FAILED:    JobFailed,
	libvirt.DOMAIN_JOB_CANCELLED: JobCancelled,
}

// JobStats is the progress of a domain's job, what a migration's convergence policy watches.
// Figures libvirt did not report are zero.
type JobStats struct {
	Type JobType
	// DataTotal, DataProcessed and DataRemaining are bytes of the whole job (memory and disks).
	DataTotal     uint64
	DataProcessed uint64
	DataRemaining uint64
	// MemoryDirtyRate is how fast the guest dirties memory, in bytes per second.
	MemoryDirtyRate uint64
	// MemoryBandwidth is how fast memory is transferred, in bytes per second.
	MemoryBandwidth uint64
	// MemoryIteration counts the passes over memory a pre-copy migration made.
	MemoryIteration uint64
	// MemoryNormal is the bytes of memory sent as whole pages, not found all zeros: in the
	// first pass over memory, what the guest has in use of what the pass has seen.
	MemoryNormal uint64
	// MemoryRemaining is the memory still to send, DataRemaining less the disks'.
	MemoryRemaining uint64
	// MemoryTotal is all the guest memory a migration sends: its RAM and QEMU's smaller
	// regions of guest memory (firmware, option ROMs, ACPI tables).
	MemoryTotal uint64
	// Resident is the guest's QEMU process's resident memory during a migration's first pass,
	// with the kernel counter's error (rssSlack), zero when not read: an upper bound on the
	// guest memory not all zeros, for the anonymous memory lifeboat's guests have (a page the
	// guest never touched is not resident, and the pass reading it maps the shared zero page,
	// which is not counted). Guest memory the host swapped out is not in it, nor would huge
	// pages be (lifeboat's domains ask for none).
	Resident uint64
	Elapsed  time.Duration
	// Downtime is how long a completed migration stopped the guest for its final copy.
	Downtime time.Duration
}

// pageSize is x86's page size, for when libvirt does not report the one the job uses.
const pageSize = 4096

// jobStatsFromLibvirt converts libvirt's job statistics. libvirt reports the dirty rate in
// pages per second.
func jobStatsFromLibvirt(info *libvirt.DomainJobInfo) JobStats {
	typ, ok := jobTypes[info.Type]
	if !ok {
		typ = JobType(fmt.Sprintf("Unknown(%d)", info.Type))
	}
	page := uint64(pageSize)
	if info.MemPageSizeSet && info.MemPageSize > 0 {
		page = info.MemPageSize
	}
	s := JobStats{Type: typ}
	if info.DataTotalSet {
		s.DataTotal = info.DataTotal
	}
	if info.DataProcessedSet {
		s.DataProcessed = info.DataProcessed
	}
	if info.DataRemainingSet {
		s.DataRemaining = info.DataRemaining
	}
	if info.MemDirtyRateSet {
		s.MemoryDirtyRate = info.MemDirtyRate * page
	}
	if info.MemBpsSet {
		s.MemoryBandwidth = info.MemBps
	}
	if info.MemIterationSet {
		s.MemoryIteration = info.MemIteration
	}
	if info.MemRemainingSet {
		s.MemoryRemaining = info.MemRemaining
	}
	if info.MemTotalSet {
		s.MemoryTotal = info.MemTotal
	}
	if info.MemNormalBytesSet {
		s.MemoryNormal = info.MemNormalBytes
	}
	if info.TimeElapsedSet {
		s.Elapsed = time.Duration(info.TimeElapsed) * time.Millisecond
	}
	if info.DowntimeSet {
		s.Downtime = time.Duration(info.Downtime) * time.Millisecond
	}
	return s
}

// JobStats reports the progress of the named domain's current job; Type is JobNone when
// there is none.
func (c *Conn) JobStats(name string) (JobStats, error) {
	return c.jobStats(name, 0)
}

// CompletedJobStats reports the statistics of the named domain's last completed job. On the
// destination of a migration, they are the migration's, downtime included: the source
// domain is gone by then.
func (c *Conn) CompletedJobStats(name string) (JobStats, error) {
	return c.jobStats(name, libvirt.DOMAIN_JOB_STATS_COMPLETED)
}

func (c *Conn) jobStats(name string, flags libvirt.DomainGetJobStatsFlags) (JobStats, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return JobStats{}, err
	}
	defer dom.Free()
	info, err := dom.GetJobStats(flags)
	if err != nil {
		return JobStats{}, fmt.Errorf("reading the job statistics of domain %q: %w", name, err)
	}
	s := jobStatsFromLibvirt(info)
	if flags == 0 && s.Type == JobUnbounded && s.MemoryIteration <= 1 {
		// Without it the policy counts the rest of the pass in use, as it would anyway.
		s.Resident = resident(dom)
	}
	return s, nil
}

// resident is the domain's QEMU process's resident set size in bytes (libvirt reads it from
// /proc, with or without a balloon) and rssSlack; zero when libvirt does not report it.
func resident(dom *libvirt.Domain) uint64 {
	stats, err := dom.MemoryStats(uint32(libvirt.DOMAIN_MEMORY_STAT_NR), 0)
	if err != nil {
		return 0
	}
	for _, st := range stats {
		if st.Tag == int32(libvirt.DOMAIN_MEMORY_STAT_RSS) && st.Val > 0 {
			return st.Val<<10 + rssSlack(runtime.NumCPU()) // KiB
		}
	}
	return 0
}

// rssSlack is how far below the truth the kernel may report a process's resident pages with cpus
// processors: from Linux 6.2 a per-CPU counter whose unfolded part is up to the batch
// (max(32, 2 × cpus) pages) on each processor; before, each thread kept up to 64 pages
// uncounted, and of QEMU's threads its vCPUs (at most cpus of them running) and a few more fault
// guest pages in. 2.5 MiB on two processors, 128 MiB on 128.
func rssSlack(cpus int) uint64 {
	n := uint64(max(cpus, 1))
	return max(n*max(32, 2*n), 64*(n+8)) * pageSize
}
