package domain

import (
	"testing"
	"time"

	"libvirt.org/go/libvirt"
)

func TestJobStatsFromLibvirt(t *testing.T) {
	tests := []struct {
		name string
		info libvirt.DomainJobInfo
		want JobStats
	}{
		{name: "no job", info: libvirt.DomainJobInfo{Type: libvirt.DOMAIN_JOB_NONE}, want: JobStats{Type: JobNone}},
		{
			name: "migration under way",
			info: libvirt.DomainJobInfo{
				Type:         libvirt.DOMAIN_JOB_UNBOUNDED,
				DataTotalSet: true, DataTotal: 300 << 20,
				DataProcessedSet: true, DataProcessed: 200 << 20,
				DataRemainingSet: true, DataRemaining: 100 << 20,
				MemRemainingSet: true, MemRemaining: 60 << 20,
				MemTotalSet: true, MemTotal: 264 << 20,
				MemDirtyRateSet: true, MemDirtyRate: 2048,
				MemPageSizeSet: true, MemPageSize: 4096,
				MemBpsSet: true, MemBps: 50 << 20,
				MemIterationSet: true, MemIteration: 3,
				MemNormalBytesSet: true, MemNormalBytes: 150 << 20,
				TimeElapsedSet: true, TimeElapsed: 6500,
			},
			want: JobStats{
				Type: JobUnbounded, DataTotal: 300 << 20, DataProcessed: 200 << 20, DataRemaining: 100 << 20, MemoryRemaining: 60 << 20,
				MemoryTotal: 264 << 20, MemoryDirtyRate: 8 << 20, MemoryBandwidth: 50 << 20, MemoryIteration: 3,
				MemoryNormal: 150 << 20, Elapsed: 6500 * time.Millisecond,
			},
		},
		{
			name: "dirty rate without a page size assumes 4 KiB",
			info: libvirt.DomainJobInfo{Type: libvirt.DOMAIN_JOB_UNBOUNDED, MemDirtyRateSet: true, MemDirtyRate: 256},
			want: JobStats{Type: JobUnbounded, MemoryDirtyRate: 1 << 20},
		},
		{
			name: "completed migration with its downtime",
			info: libvirt.DomainJobInfo{Type: libvirt.DOMAIN_JOB_COMPLETED, TimeElapsedSet: true, TimeElapsed: 4200, DowntimeSet: true, Downtime: 35},
			want: JobStats{Type: JobCompleted, Elapsed: 4200 * time.Millisecond, Downtime: 35 * time.Millisecond},
		},
		{
			name: "figures not set are zero",
			info: libvirt.DomainJobInfo{Type: libvirt.DOMAIN_JOB_COMPLETED, DataTotal: 1, TimeElapsed: 5, Downtime: 7},
			want: JobStats{Type: JobCompleted},
		},
		{name: "a job type newer than lifeboat", info: libvirt.DomainJobInfo{Type: libvirt.DomainJobType(42)}, want: JobStats{Type: "Unknown(42)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := jobStatsFromLibvirt(&tt.info); got != tt.want {
				t.Errorf("jobStatsFromLibvirt() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// The kernel's resident count may lag by a per-CPU batch (Linux 6.2 on) or 64 pages a thread
// (before): the bound adds the larger.
func TestRSSSlack(t *testing.T) {
	for _, tc := range []struct {
		cpus int
		want uint64
	}{
		{1, 64 * 9 * pageSize}, {2, 64 * 10 * pageSize}, {0, 64 * 9 * pageSize},
		{32, 64 * 40 * pageSize}, {128, 128 * 256 * pageSize},
	} {
		if got := rssSlack(tc.cpus); got != tc.want {
			t.Errorf("rssSlack(%d) = %d KiB, want %d KiB", tc.cpus, got>>10, tc.want>>10)
		}
	}
}
