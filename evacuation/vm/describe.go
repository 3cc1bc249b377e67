package vm

import (
	"cmp"
	"fmt"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// MigrationLine tells a migration's state in one line, as `kubectl lifeboat status` and the
// demo's follower print it: phase, cause, convergence mode, bytes left, rates and the time left
// to its deadline.
func MigrationLine(m *v1alpha1.VirtualMachineInstanceMigration, now time.Time) string {
	// A migration the migration controller has not taken up yet has no phase, nor cause.
	line := fmt.Sprintf("migration %s: %-15s", m.Name, cmp.Or(string(m.Status.Phase), "New"))
	if m.Status.Cause != "" {
		line += " cause " + string(m.Status.Cause)
	}
	if m.Status.Mode != "" {
		line += ", mode " + string(m.Status.Mode)
	}
	if p := m.Status.Progress; p != nil && p.DataTotal > 0 && !m.Status.Phase.Terminal() {
		line += fmt.Sprintf(", %s of %s left, dirtying %s/s, sending %s/s", mib(p.DataRemaining), mib(p.DataTotal), mib(p.MemoryDirtyRate), mib(p.MemoryBandwidth))
	}
	if d := m.Status.Deadline; d != nil && !m.Status.Phase.Terminal() {
		line += fmt.Sprintf(", deadline in %s", d.Sub(now).Truncate(time.Second))
	}
	if m.Status.FailureReason != "" {
		line += ": " + m.Status.FailureReason
	}
	return line
}

func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }
