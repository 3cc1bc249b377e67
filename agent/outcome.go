package agent

import "time"

// FailedCall is what the source agent knows, a moment after its libvirt migration call returned
// an error, of where the guest is. The error alone does not say: a source launcher exits once
// its guest has left by migration, and its libvirtd with it, so the reply to a call that
// succeeded can be lost as "End of file while reading data".
type FailedCall struct {
	// LeftByMigration: the source launcher reported that its guest left by migration.
	LeftByMigration bool
	// TargetRan: the target node's agent recorded the guest running in the target launcher
	// (the VMI's migrationState.targetNodeDomainReadyTimestamp).
	TargetRan bool
	// SourceAlive: the source launcher's libvirt still has the guest, alive.
	SourceAlive bool
	// SourceRunning: the source launcher's libvirt runs the guest, not paused. Its migration
	// job is over, and libvirt resumed the guest there (or never stopped it): a guest that left
	// is paused until it is stopped, so no word that it left can still come.
	SourceRunning bool
	// SourceSilent: the source launcher can say no more: its reports have all been read, or the
	// agent no longer reaches its libvirt.
	SourceSilent bool
	// SourceExit is the source launcher's exit code once its container ended; nil while it runs
	// or when its pod is gone. A launcher exits 0 once its guest has left by migration, so any
	// other code says the guest did not leave with its knowledge (killed by a hard eviction, say).
	SourceExit *int32
	// PostCopy: the migration had switched to post-copy, where the target runs the guest
	// before the migration is over.
	PostCopy bool
	// Waited is how long the agent has looked since the call failed.
	Waited time.Duration
}

// CallOutcome is what a failed migration call turns out to have done.
type CallOutcome int

const (
	// OutcomeWait: look again; the word of the launchers may still come.
	OutcomeWait CallOutcome = iota
	// OutcomeSucceeded: the guest runs on the target.
	OutcomeSucceeded
	// OutcomeFailed: the guest stayed on the source.
	OutcomeFailed
	// OutcomeUnknown: the guest is gone from the source and the target never said it runs
	// there; it is not on the source to keep running.
	OutcomeUnknown
)

// Bounds of the wait for word after a failed migration call. A source launcher that still has
// its guest, paused, has its reports read within launcherReportWait. One whose guest is gone said
// nothing, or its last words were lost with its connection: only the target can tell, and
// its agent may be slow (a loaded node), so it is given longer: waiting costs nothing, since
// a guest gone from the source can be nowhere else but on the target.
const (
	launcherReportWait = 6 * time.Second
	targetWordWait     = 30 * time.Second
)

// DecideFailedCall says what a migration whose libvirt call failed did.
func DecideFailedCall(c FailedCall) CallOutcome {
	switch {
	case c.LeftByMigration:
		return OutcomeSucceeded
	case c.TargetRan && !c.PostCopy:
		// The target runs the guest only once the migration finished, and, unless post-copy was
		// allowed, once the source's QEMU has ended (domain.HandOff); in post-copy it runs while
		// its memory is still on the source.
		return OutcomeSucceeded
	case c.SourceRunning && !c.PostCopy:
		// Waiting for the launcher's word would only cost the retry time before a deadline
		// (seed 10's soak-0 lost 6 s so).
		return OutcomeFailed
	case c.SourceAlive && (c.SourceSilent || c.Waited >= launcherReportWait):
		return OutcomeFailed
	case c.SourceAlive:
		return OutcomeWait
	case c.SourceExit != nil && *c.SourceExit != 0:
		// Ended without seeing its guest leave; had the guest arrived, the target's record,
		// written before the source confirms, would be there.
		return OutcomeUnknown
	case c.Waited >= targetWordWait:
		return OutcomeUnknown
	default:
		return OutcomeWait
	}
}
