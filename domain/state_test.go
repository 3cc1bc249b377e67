package domain

import (
	"testing"

	"libvirt.org/go/libvirt"
)

func TestStateFromLibvirt(t *testing.T) {
	tests := []struct {
		name       string
		state      libvirt.DomainState
		reason     int
		wantState  State
		wantReason Reason
	}{
		{"booted", libvirt.DOMAIN_RUNNING, int(libvirt.DOMAIN_RUNNING_BOOTED), Running, ReasonBooted},
		{"migrated in", libvirt.DOMAIN_RUNNING, int(libvirt.DOMAIN_RUNNING_MIGRATED), Running, ReasonMigrated},
		{"post-copy", libvirt.DOMAIN_RUNNING, int(libvirt.DOMAIN_RUNNING_POSTCOPY), Running, ReasonPostcopy},
		{"blocked counts as running", libvirt.DOMAIN_BLOCKED, 0, Running, ReasonUnknown},
		{"paused by a user", libvirt.DOMAIN_PAUSED, int(libvirt.DOMAIN_PAUSED_USER), Paused, ReasonUser},
		{"paused for migration", libvirt.DOMAIN_PAUSED, int(libvirt.DOMAIN_PAUSED_MIGRATION), Paused, ReasonMigration},
		{"paused on I/O error", libvirt.DOMAIN_PAUSED, int(libvirt.DOMAIN_PAUSED_IOERROR), Paused, ReasonIOError},
		{"shutting down", libvirt.DOMAIN_SHUTDOWN, int(libvirt.DOMAIN_SHUTDOWN_USER), ShuttingDown, ReasonUser},
		{"shut down", libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_SHUTDOWN), Shutoff, ReasonShutdown},
		{"destroyed", libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_DESTROYED), Shutoff, ReasonDestroyed},
		{"migrated away", libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_MIGRATED), Shutoff, ReasonMigrated},
		{"failed to start", libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_FAILED), Shutoff, ReasonFailed},
		{"never started", libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_UNKNOWN), Shutoff, ReasonUnknown},
		{"panicked", libvirt.DOMAIN_CRASHED, int(libvirt.DOMAIN_CRASHED_PANICKED), Crashed, ReasonPanicked},
		{"suspended to memory", libvirt.DOMAIN_PMSUSPENDED, 0, PMSuspended, ReasonUnknown},
		{"no state", libvirt.DOMAIN_NOSTATE, 0, NoState, ReasonUnknown},
		{"a reason newer than lifeboat", libvirt.DOMAIN_RUNNING, 999, Running, ReasonUnknown},
		{"a state newer than lifeboat", libvirt.DomainState(99), 0, NoState, ReasonUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, reason := stateFromLibvirt(tt.state, tt.reason)
			if state != tt.wantState || reason != tt.wantReason {
				t.Errorf("stateFromLibvirt() = %s, %s, want %s, %s", state, reason, tt.wantState, tt.wantReason)
			}
		})
	}
}

func TestEventFromLibvirt(t *testing.T) {
	tests := []struct {
		name   string
		event  libvirt.DomainEventType
		detail int
		want   Event
	}{
		{"started", libvirt.DOMAIN_EVENT_STARTED, int(libvirt.DOMAIN_EVENT_STARTED_BOOTED), Event{"d", EventStarted, Running, ReasonBooted}},
		{"migration target started", libvirt.DOMAIN_EVENT_STARTED, int(libvirt.DOMAIN_EVENT_STARTED_MIGRATED), Event{"d", EventStarted, Running, ReasonMigrated}},
		{"paused for migration", libvirt.DOMAIN_EVENT_SUSPENDED, int(libvirt.DOMAIN_EVENT_SUSPENDED_MIGRATED), Event{"d", EventSuspended, Paused, ReasonMigration}},
		{"resumed", libvirt.DOMAIN_EVENT_RESUMED, int(libvirt.DOMAIN_EVENT_RESUMED_UNPAUSED), Event{"d", EventResumed, Running, ReasonUnpaused}},
		{"guest finished shutting down", libvirt.DOMAIN_EVENT_SHUTDOWN, int(libvirt.DOMAIN_EVENT_SHUTDOWN_FINISHED), Event{"d", EventShutdown, ShuttingDown, ReasonShutdown}},
		{"guest asked to shut down", libvirt.DOMAIN_EVENT_SHUTDOWN, int(libvirt.DOMAIN_EVENT_SHUTDOWN_GUEST), Event{"d", EventShutdown, ShuttingDown, ReasonGuest}},
		{"stopped after shutdown", libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN), Event{"d", EventStopped, Shutoff, ReasonShutdown}},
		{"destroyed", libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_DESTROYED), Event{"d", EventStopped, Shutoff, ReasonDestroyed}},
		{"migrated away", libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_MIGRATED), Event{"d", EventStopped, Shutoff, ReasonMigrated}},
		{"crashed", libvirt.DOMAIN_EVENT_CRASHED, int(libvirt.DOMAIN_EVENT_CRASHED_PANICKED), Event{"d", EventCrashed, Crashed, ReasonPanicked}},
		{"defined leaves the state", libvirt.DOMAIN_EVENT_DEFINED, int(libvirt.DOMAIN_EVENT_DEFINED_ADDED), Event{"d", EventDefined, NoState, ReasonUnknown}},
		{"an unknown detail", libvirt.DOMAIN_EVENT_STOPPED, 999, Event{"d", EventStopped, Shutoff, ReasonUnknown}},
		{"an unknown event", libvirt.DomainEventType(99), 0, Event{"d", "Unknown(99)", NoState, ReasonUnknown}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := eventFromLibvirt("d", libvirt.DomainEventLifecycle{Event: tt.event, Detail: tt.detail})
			if got != tt.want {
				t.Errorf("eventFromLibvirt() = %+v, want %+v", got, tt.want)
			}
		})
	}
}
