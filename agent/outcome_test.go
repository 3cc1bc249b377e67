package agent

import (
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func TestDecideFailedCall(t *testing.T) {
	cases := []struct {
		name string
		call FailedCall
		want CallOutcome
	}{
		{"the source launcher said its guest left", FailedCall{LeftByMigration: true, SourceSilent: true}, OutcomeSucceeded},
		{"the target runs the guest though the source said nothing (its launcher exited with the call's reply)",
			FailedCall{TargetRan: true, SourceSilent: true}, OutcomeSucceeded},
		{"the target runs the guest while the source's is paused, not yet stopped",
			FailedCall{TargetRan: true, SourceAlive: true}, OutcomeSucceeded},
		{"in post-copy the target runs the guest before the migration is over",
			FailedCall{TargetRan: true, PostCopy: true, SourceSilent: true, Waited: targetWordWait}, OutcomeUnknown},
		{"the guest is alive on the source and its launcher said all it had", FailedCall{SourceAlive: true, SourceSilent: true}, OutcomeFailed},
		{"the guest is paused on the source: its report may still come", FailedCall{SourceAlive: true, Waited: time.Second}, OutcomeWait},
		{"seed 10's soak-0: the target agent's proxy went, libvirt resumed the guest on the source: failed at once",
			FailedCall{SourceAlive: true, SourceRunning: true}, OutcomeFailed},
		{"the guest runs on the source but the target recorded it running: the target's word holds",
			FailedCall{TargetRan: true, SourceAlive: true, SourceRunning: true}, OutcomeSucceeded},
		{"in post-copy a running source is not taken at its word",
			FailedCall{SourceAlive: true, SourceRunning: true, PostCopy: true, Waited: time.Second}, OutcomeWait},
		{"the guest is alive on the source and no report came in time", FailedCall{SourceAlive: true, Waited: launcherReportWait}, OutcomeFailed},
		{"the guest is gone from the source, nobody said where: wait for the target",
			FailedCall{SourceSilent: true, Waited: launcherReportWait}, OutcomeWait},
		{"the source launcher was killed and the target says nothing: the guest did not leave",
			FailedCall{SourceSilent: true, SourceExit: ptr.To[int32](137)}, OutcomeUnknown},
		{"the source launcher exited 0 and nobody said where the guest went: wait for the target",
			FailedCall{SourceSilent: true, SourceExit: ptr.To[int32](0), Waited: launcherReportWait}, OutcomeWait},
		{"the source launcher was killed after the target ran the guest",
			FailedCall{TargetRan: true, SourceSilent: true, SourceExit: ptr.To[int32](137)}, OutcomeSucceeded},
		{"the guest is gone from the source and the target never said it runs there",
			FailedCall{SourceSilent: true, Waited: targetWordWait}, OutcomeUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := DecideFailedCall(c.call); got != c.want {
				t.Errorf("DecideFailedCall(%+v) = %d, want %d", c.call, got, c.want)
			}
		})
	}
}
