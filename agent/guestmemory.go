package agent

import (
	"log/slog"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// guestMemoryWait bounds the wait for a launcher's answer about its guest's memory (a few
// milliseconds where it answers): the convergence loop asks on its tick (progressInterval) and
// must not miss the next.
const guestMemoryWait = 300 * time.Millisecond

// The results of GuestMemoryReadings.
const (
	guestMemoryAnswered   = "answered"
	guestMemoryUnanswered = "unanswered"
)

// guestRAMBound is the most guest memory in use that its launcher's reading says: the RAM's
// resident bytes (of size) and every other region a migration sends (firmware, option ROMs, ACPI
// tables: libvirt's memory total less the RAM) counted whole. ok is false where libvirt's total
// is not known or smaller than the RAM, which would be no bound.
func guestRAMBound(resident, size, memoryTotal uint64) (uint64, bool) {
	if memoryTotal == 0 || memoryTotal < size || resident > size {
		return 0, false
	}
	return resident + memoryTotal - size, true
}

// guestRAM is ConvergingMigration.GuestRAM for the VMI ref on this node: its launcher's answer,
// or nothing. A launcher that does not answer in time is not asked again during this migration
// (an older launcher has no answer to give).
func (a *Agent) guestRAM(ref notify.VMIRef, log *slog.Logger) func() (resident, size uint64, ok bool) {
	asking := true
	return func() (uint64, uint64, bool) {
		if !asking {
			return 0, 0, false
		}
		resident, size, ok := a.askGuestMemory(ref)
		if ok {
			a.cfg.Metrics.GuestMemoryReadings.WithLabelValues(guestMemoryAnswered).Inc()
		} else {
			asking = false
			a.cfg.Metrics.GuestMemoryReadings.WithLabelValues(guestMemoryUnanswered).Inc()
			log.Info("the launcher did not say how much of its guest's memory is resident; the first pass bounds what the guest has in use by QEMU's resident memory", "waited", guestMemoryWait)
		}
		return resident, size, ok
	}
}

// askGuestMemory asks the launcher of ref how much of its guest's RAM is resident and waits for
// its answer at most guestMemoryWait. The launcher runs on this node, with its clock: an answer
// timed before the question was meant for an earlier one.
func (a *Agent) askGuestMemory(ref notify.VMIRef) (resident, size uint64, ok bool) {
	tell := a.cfg.TellLauncher
	if tell == nil {
		return 0, 0, false
	}
	answers := make(chan *notify.Message, 1)
	a.guestMemory.Store(ref.UID, answers)
	defer a.guestMemory.CompareAndDelete(ref.UID, answers)
	asked := time.Now()
	if !tell(ref.UID, &notify.Message{Kind: notify.KindGuestMemoryQuery, VMI: ref, Time: asked}) {
		return 0, 0, false
	}
	timeout := time.NewTimer(guestMemoryWait)
	defer timeout.Stop()
	for {
		select {
		case m := <-answers:
			if !m.Time.Before(asked) {
				return m.GuestMemoryResidentBytes, m.GuestMemoryBytes, true
			}
		case <-timeout.C:
			return 0, 0, false
		}
	}
}

// guestMemoryAnswered hands a launcher's KindGuestMemory to the question waiting for it; an
// answer nobody waits for is dropped.
func (a *Agent) guestMemoryAnswered(m *notify.Message) {
	if ch, ok := a.guestMemory.Load(m.VMI.UID); ok {
		select {
		case ch.(chan *notify.Message) <- m:
		default:
		}
	}
}
