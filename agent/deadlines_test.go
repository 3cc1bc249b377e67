package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/domain"
	"k8s.io/apimachinery/pkg/util/wait"
)

// slowLauncher answers JobStats at once; its Shutdown waits until release is closed, as libvirt's
// does while another job holds the domain's job lock.
type slowLauncher struct {
	healthyLauncher
	release chan struct{}
	cut     chan struct{}
}

func (s *slowLauncher) Shutdown(context.Context, string) error {
	select {
	case <-s.release:
	case <-s.cut:
	}
	return nil
}
func (s *slowLauncher) Cut()                                                         { close(s.cut) }
func (s *slowLauncher) Migrate(context.Context, string, domain.MigrateOptions) error { return nil }
func (s *slowLauncher) JobStats(string) (domain.JobStats, error) {
	return domain.JobStats{Type: domain.JobUnbounded}, nil
}
func (s *slowLauncher) StartDirtyRateCalc(string, time.Duration, domain.DirtyRateMode) error {
	return nil
}
func (s *slowLauncher) DirtyRate(string) (uint64, bool, error) { return 0, false, nil }
func (s *slowLauncher) StartPostCopy(string) error             { return nil }
func (s *slowLauncher) State(string) (domain.State, domain.Reason, error) {
	return domain.Running, domain.ReasonUnknown, nil
}
func (s *slowLauncher) Suspend(string) error                             { return nil }
func (s *slowLauncher) Resume(string) error                              { return nil }
func (s *slowLauncher) LoadQEMUCapabilities() error                      { return nil }
func (s *slowLauncher) Session() bool                                    { return true }
func (s *slowLauncher) Observe(context.Context, string) (*Domain, error) { return nil, nil }

// While a worker's call waits (for the domain's job lock, say), another worker's call to the same
// launcher fails in its turn, and a migration's own loop, which takes no turn, is answered at once:
// the loop's escalations are never held behind a worker. Once released, turns resume.
func TestAMigrationsLoopTakesNoWorkersTurn(t *testing.T) {
	inner := &slowLauncher{healthyLauncher: healthyLauncher{changes: make(chan struct{})}, release: make(chan struct{}), cut: make(chan struct{})}
	g := newGuardedConn(inner, func(string, time.Duration) { t.Error("a call stalled") })
	defer g.Close()
	shutdown := make(chan error, 1)
	go func() { shutdown <- g.Shutdown(t.Context(), "vm") }()
	// The worker's call holds the turn.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) { return len(g.turn) != 0, nil }); err != nil {
		t.Fatal("the worker's call never took its turn")
	}
	start := time.Now()
	if _, err := loopMigrator(g).JobStats("vm"); err != nil || time.Since(start) > 100*time.Millisecond {
		t.Errorf("the migration loop's call: %v after %s; want an answer at once", err, time.Since(start))
	}
	start = time.Now()
	if _, err := g.JobStats("vm"); !errors.Is(err, errLauncherBusy) || time.Since(start) < launcherTurnWait {
		t.Errorf("another worker's call: %v after %s; want %v after its turn's wait (%s)", err, time.Since(start), errLauncherBusy, launcherTurnWait)
	}
	close(inner.release)
	if err := <-shutdown; err != nil {
		t.Fatal(err)
	}
	if _, err := g.JobStats("vm"); err != nil {
		t.Errorf("a call after the turn came back: %v", err)
	}
}

func TestStallBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 4: 4 * time.Minute, 5: 5 * time.Minute, 50: 5 * time.Minute} {
		if got := stallBackoff(n); got != want {
			t.Errorf("stallBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}
