package domain_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/migrationpair"
)

// handoffWait bounds the wait for a hand-off's outcome once the migration call has returned.
const handoffWait = 30 * time.Second

// nextHandoff waits for the next hand-off's outcome.
func nextHandoff(t *testing.T, outcomes <-chan migrationpair.HandoffOutcome) migrationpair.HandoffOutcome {
	t.Helper()
	select {
	case o := <-outcomes:
		return o
	case <-time.After(handoffWait):
		t.Fatalf("no hand-off ended within %s of the migration's end", handoffWait)
		return migrationpair.HandoffOutcome{}
	}
}

func TestAGuestPausedOnArrivalRunsThereOnceTheSourceGaveItUp(t *testing.T) {
	p := migrationpair.New(t)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, domain.GuestVMI(t, "handoff"), testAcceleration(t))
	outcomes := p.HandOffs(t, ctx, name)
	opts := p.Options(0)
	opts.PausedOnArrival = true
	if err := p.Src.Conn.Migrate(ctx, name, opts); err != nil {
		t.Fatal(err)
	}
	if o := nextHandoff(t, outcomes); o.Err != nil || o.Result != domain.HandoffResumed {
		t.Fatalf("hand-off = %s, %v; want %s", o.Result, o.Err, domain.HandoffResumed)
	}
	checkMoved(t, ctx, p, name)
}

// A migration whose destination finished while the source never heard of it (the connection
// between the nodes broke in that moment; the soak saw it when it killed the target's agent)
// leaves the guest running on the source only: the destination keeps its copy paused.
func TestALostConfirmationLeavesTheGuestRunningOnTheSourceOnly(t *testing.T) {
	p := migrationpair.New(t)
	ctx := domain.GuestContext(t)
	name := p.RunGuest(t, ctx, domain.GuestVMI(t, "lostconfirm"), testAcceleration(t))
	outcomes := p.HandOffs(t, ctx, name)
	// Capped, so that the hold below comes well before the migration's end.
	opts := p.Options(16 << 20)
	opts.PausedOnArrival = true
	result := migrateAsync(ctx, p.Src.Conn, name, opts)
	// Once the source's job runs, its daemon has nothing more to hear from the target's until
	// the destination finishes.
	if _, err := waitJob(ctx, p.Src.Conn, name, result, "a running job", func(s domain.JobStats) bool { return s.Type == domain.JobUnbounded }); err != nil {
		t.Fatal(err)
	}
	release := p.HoldLibvirtReplies()
	defer release()
	kubewait.For(t, time.Minute, "the destination to finish receiving the guest", func(context.Context) (string, error) {
		state, reason, err := p.Dst.Conn.State(name)
		return fmt.Sprintf("%s (%s)", state, reason), err
	}, func(s string) bool {
		return s == fmt.Sprintf("%s (%s)", domain.Paused, domain.ReasonUser) || s == fmt.Sprintf("%s (%s)", domain.Running, domain.ReasonMigrated)
	}, nil)
	if n := p.BreakConnections(); n == 0 {
		t.Fatal("no connection between the nodes to break")
	}
	select {
	case err := <-result:
		if err == nil {
			t.Fatal("Migrate() = nil; want the error of a migration whose destination never answered")
		}
		t.Logf("Migrate() = %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the migration did not end within a minute of the connections breaking")
	}
	if o := nextHandoff(t, outcomes); o.Err != nil || o.Result != domain.HandoffSourceRuns {
		t.Fatalf("hand-off = %s, %v; want %s", o.Result, o.Err, domain.HandoffSourceRuns)
	}
	kubewait.Consistently(t, 3*time.Second, "the guest running on the source and paused on the destination", func(context.Context) error {
		src, srcReason, err := p.Src.Conn.State(name)
		if err != nil {
			return fmt.Errorf("reading the source's domain: %w", err)
		}
		dst, dstReason, err := p.Dst.Conn.State(name)
		if err != nil {
			return fmt.Errorf("reading the destination's domain: %w", err)
		}
		if src != domain.Running || dst == domain.Running {
			return fmt.Errorf("the source's domain is %s (%s) and the destination's %s (%s)", src, srcReason, dst, dstReason)
		}
		return nil
	})
}
