package launcher

import (
	"errors"
	"testing"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/domain"
)

func TestExitCodeFor(t *testing.T) {
	cases := []struct {
		name   string
		state  domain.State
		reason domain.Reason
		code   int
		done   bool
	}{
		{"running: not over", domain.Running, domain.ReasonBooted, 0, false},
		{"shutting down: not over yet", domain.ShuttingDown, domain.ReasonShutdown, 0, false},
		{"paused for a migration: not over", domain.Paused, domain.ReasonMigration, 0, false},
		{"powered off", domain.Shutoff, domain.ReasonShutdown, contract.ExitGuestPoweredOff, true},
		{"migrated away: the VM lives on", domain.Shutoff, domain.ReasonMigrated, contract.ExitGuestPoweredOff, true},
		{"destroyed", domain.Shutoff, domain.ReasonDestroyed, contract.ExitDestroyed, true},
		{"crashed and destroyed", domain.Shutoff, domain.ReasonCrashed, contract.ExitCrashed, true},
		{"crashed", domain.Crashed, domain.ReasonPanicked, contract.ExitCrashed, true},
	}
	for _, tc := range cases {
		if code, done := ExitCodeFor(tc.state, tc.reason); code != tc.code || done != tc.done {
			t.Errorf("%s: got %d, %v; want %d, %v", tc.name, code, done, tc.code, tc.done)
		}
	}
}

// How the domain ended is told by its event, or by its state now where the event does not say;
// the reason is the one that decided. A migration's pause read after the guest stopped must say
// Migrated, or the launcher would exit before its hand-off and the agent would not learn that
// the guest left by migration.
func TestDomainEnd(t *testing.T) {
	now := func(state domain.State, reason domain.Reason, err error) func() (domain.State, domain.Reason, error) {
		return func() (domain.State, domain.Reason, error) { return state, reason, err }
	}
	paused := domain.Event{Type: domain.EventSuspended, State: domain.Paused, Reason: domain.ReasonMigration}
	cases := []struct {
		name    string
		ev      domain.Event
		current func() (domain.State, domain.Reason, error)
		code    int
		reason  domain.Reason
		end     int
	}{
		{"stopped, migrated away", domain.Event{Type: domain.EventStopped, State: domain.Shutoff, Reason: domain.ReasonMigrated}, nil,
			contract.ExitGuestPoweredOff, domain.ReasonMigrated, endKnown},
		{"the migration's pause, read after the guest stopped", paused, now(domain.Shutoff, domain.ReasonMigrated, nil),
			contract.ExitGuestPoweredOff, domain.ReasonMigrated, endKnown},
		{"the migration's pause, the guest still paused", paused, now(domain.Paused, domain.ReasonMigration, nil), 0, "", endNot},
		{"the migration's pause, the domain already undefined", paused, now("", "", domain.ErrNotFound), 0, "", endUnknown},
		{"the migration's pause, libvirt not answering", paused, now("", "", errors.New("connection reset")), 0, "", endNot},
		{"undefined", domain.Event{Type: domain.EventUndefined, State: domain.NoState}, nil, contract.ExitGuestPoweredOff, "", endKnown},
		{"crashed", domain.Event{Type: domain.EventCrashed, State: domain.Crashed, Reason: domain.ReasonPanicked}, nil,
			contract.ExitCrashed, domain.ReasonPanicked, endKnown},
	}
	for _, tc := range cases {
		code, reason, end := domainEnd(tc.ev, tc.current)
		if code != tc.code || reason != tc.reason || end != tc.end {
			t.Errorf("%s: got %d, %q, %d; want %d, %q, %d", tc.name, code, reason, end, tc.code, tc.reason, tc.end)
		}
	}
}
