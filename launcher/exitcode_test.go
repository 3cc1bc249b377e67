package launcher

import (
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
