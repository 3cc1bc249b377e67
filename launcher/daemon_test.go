package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/migrationpair"
)

func TestNextRestart(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	ago := func(ds ...time.Duration) []time.Time {
		var out []time.Time
		for _, d := range ds {
			out = append(out, now.Add(-d))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		past      []time.Time
		wantDelay time.Duration
		wantOK    bool
	}{
		{"first", nil, 500 * time.Millisecond, true},
		{"second, soon after the first", ago(time.Minute), time.Second, true},
		{"fifth in the window", ago(time.Minute, 2*time.Minute, 3*time.Minute, 4*time.Minute), 8 * time.Second, true},
		{"sixth in the window: gives up", ago(time.Second, time.Minute, 2*time.Minute, 3*time.Minute, 9*time.Minute), 0, false},
		{"old restarts do not count", ago(10*time.Minute, 11*time.Minute, 20*time.Minute, time.Hour, 2*time.Hour, time.Minute), time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			delay, ok := nextRestart(tc.past, now)
			if delay != tc.wantDelay || ok != tc.wantOK {
				t.Errorf("nextRestart(%v) = %s, %v; want %s, %v", tc.past, delay, ok, tc.wantDelay, tc.wantOK)
			}
		})
	}
}

// guestTimeout bounds waits on a guest under TCG, on a machine shared with other work.
const guestTimeout = 3 * time.Minute

// testVMI is a VMI that boots the test guest with 128 MiB and extra kernel parameters.
func testVMI(t *testing.T, name string, params ...string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := guest.Ensure(ctx, os.Stderr)
	if err != nil {
		t.Fatalf("building the test guest: %v", err)
	}
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uuid.NewString())},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs:   1,
			Memory: resource.MustParse("128Mi"),
			Boot:   v1alpha1.BootSource{Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: strings.Join(append([]string{guest.Cmdline}, params...), " ")},
		},
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// killDaemon SIGKILLs node's libvirtd itself, as the soak does, and waits until it is gone.
func killDaemon(t *testing.T, ctx context.Context, d *domain.Libvirtd) {
	t.Helper()
	pid, err := d.DaemonPid()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-ctx.Done():
		t.Fatalf("libvirtd %d did not exit on SIGKILL", pid)
	}
}

// waitCounter waits until the console's counter reaches min and returns the console.
func waitCounter(t *testing.T, ctx context.Context, console string, min int, where string) string {
	t.Helper()
	out, err := guest.WaitForConsole(ctx, console, fmt.Sprintf("counter %d %s", min, where), func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n >= min
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkOneBoot fails the test if the console shows the guest booted more than once.
func checkOneBoot(t *testing.T, console string) {
	t.Helper()
	if n := strings.Count(console, protocol.Ready); n != 1 {
		t.Errorf("the console shows %q %d times, want once: the guest rebooted", protocol.Ready, n)
	}
}

// freshState is the domain's state through a connection of its own, as the agent's would be.
func freshState(t *testing.T, d *domain.Libvirtd, name string) (domain.State, domain.Reason, error) {
	t.Helper()
	c, err := domain.Connect(d.Socket())
	if err != nil {
		return domain.NoState, domain.ReasonUnknown, err
	}
	defer c.Close()
	return c.State(name)
}

// TestALauncherRestartsItsKilledLibvirtd: a launcher whose libvirtd is killed outright starts
// it again and goes on serving its guest, which neither stops nor reboots: the guest's counter
// goes on, a fresh connection finds the domain Running, the agent hears of the restart, and
// the launcher still follows the domain (a destroy ends it, with the destroy's exit code).
func TestALauncherRestartsItsKilledLibvirtd(t *testing.T) {
	p := migrationpair.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
	defer cancel()

	agentSocket := filepath.Join(t.TempDir(), "notify.sock")
	agent, err := net.Listen("unix", agentSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	notifier := NewNotifier(agentSocket, notify.VMIRef{Namespace: "default", Name: "survivor", UID: "u"}, quietLog())
	go notifier.Run(ctx)

	s, err := openSession(ctx, p.Src.Daemon, notifier, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name := p.RunGuest(t, ctx, testVMI(t, "survivor"), domain.TCG)
	ended := watchInBackground(ctx, s, name)
	before, _ := protocol.LastCounter(waitCounter(t, ctx, p.Src.Console(), 3, "before the kill"))

	killDaemon(t, ctx, p.Src.Daemon)
	killed := time.Now()
	// Restarted, and serving the guest again, within a deadline.
	var state domain.State
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if s.Restarts() < 1 {
			return false, nil
		}
		state, _, lastErr = freshState(t, p.Src.Daemon, name)
		return lastErr == nil && state == domain.Running, nil
	})
	if err != nil {
		t.Fatalf("30 s after libvirtd was killed: %d restart(s), the domain %s through a fresh connection (error %v); want a restart and %s", s.Restarts(), state, lastErr, domain.Running)
	}
	t.Logf("the domain was Running through a restarted libvirtd %s after the kill", time.Since(killed).Round(time.Millisecond))
	select {
	case r := <-ended:
		t.Fatalf("the launcher ended when its libvirtd was killed: exit code %d, %v", r.code, r.err)
	default:
	}
	checkOneBoot(t, waitCounter(t, ctx, p.Src.Console(), before+3, "after the restart"))
	if got := readKinds(t, agent, 2); got[1] != notify.KindLibvirtdRestarted {
		t.Errorf("the agent heard %v, want Hello, %s", got, notify.KindLibvirtdRestarted)
	}

	// The launcher follows the domain on its new connection: a destroy ends it as it should.
	c, err := domain.Connect(p.Src.Daemon.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Destroy(name); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ended:
		if r.code != contract.ExitDestroyed || r.err != nil {
			t.Errorf("after the destroy the launcher returned %d, %v; want %d (destroyed)", r.code, r.err, contract.ExitDestroyed)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the launcher did not see its domain destroyed after its libvirtd's restart")
	}
}

// dirtyingVMI is a guest that rewrites 64 MiB at 256 MiB/s: a migration capped at
// nonConvergingCap never converges, so a kill lands in the middle of one.
func dirtyingVMI(t *testing.T, name string) *v1alpha1.VirtualMachineInstance {
	vmi := testVMI(t, name, protocol.DirtyParam+"=64M", protocol.DirtyRateParam+"=256M")
	vmi.Spec.Memory = resource.MustParse("256Mi")
	return vmi
}

const nonConvergingCap = 8 << 20

// TestAKillDuringAMigrationLeavesTheGuestWhereItWas: libvirtd killed in the middle of a live
// migration, on the source or on the target, fails the migration, and the guest runs on where it
// was, on the source, without a reboot, once the killed daemon was restarted; the target has no
// copy of it.
func TestAKillDuringAMigrationLeavesTheGuestWhereItWas(t *testing.T) {
	for _, side := range []string{"source", "target"} {
		t.Run(side, func(t *testing.T) {
			p := migrationpair.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
			defer cancel()
			killed := p.Src
			if side == "target" {
				killed = p.Dst
			}
			s, err := openSession(ctx, killed.Daemon, NewNotifier(filepath.Join(t.TempDir(), "none"), notify.VMIRef{}, quietLog()), quietLog())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			name := p.RunGuest(t, ctx, dirtyingVMI(t, "kept-"+side), domain.TCG)

			// The migration runs on a connection of its own, as the agent's.
			agentConn, err := domain.Connect(p.Src.Daemon.Socket())
			if err != nil {
				t.Fatal(err)
			}
			defer agentConn.Close()
			migrated := make(chan error, 1)
			go func() { migrated <- agentConn.Migrate(ctx, name, p.Options(nonConvergingCap)) }()
			err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
				st, err := p.Src.Conn.JobStats(name)
				return err == nil && st.Type == domain.JobUnbounded && st.MemoryIteration >= 2, nil
			})
			if err != nil {
				t.Fatalf("the migration did not reach its second pass over memory: %v", err)
			}
			console, err := os.ReadFile(p.Src.Console())
			if err != nil {
				t.Fatal(err)
			}
			before, _ := protocol.LastCounter(string(console))

			killDaemon(t, ctx, killed.Daemon)
			if err := s.recover(ctx); err != nil {
				t.Fatalf("restarting the %s's libvirtd: %v", side, err)
			}
			select {
			case err := <-migrated:
				if err == nil {
					t.Fatal("the migration succeeded though a libvirtd was killed in its middle")
				}
				t.Logf("Migrate() = %v", err)
			case <-time.After(time.Minute):
				t.Fatal("Migrate() did not return within a minute of the kill")
			}

			// The guest runs on the source and nowhere else.
			var state domain.State
			var reason domain.Reason
			var lastErr error
			err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				state, reason, lastErr = freshState(t, p.Src.Daemon, name)
				return lastErr == nil && state == domain.Running, nil
			})
			if err != nil {
				t.Errorf("after the failed migration the source's domain is %s (%s), error %v; want %s", state, reason, lastErr, domain.Running)
			}
			err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				state, reason, lastErr = freshState(t, p.Dst.Daemon, name)
				return errors.Is(lastErr, domain.ErrNotFound), nil
			})
			if err != nil {
				t.Errorf("after the failed migration the target still has the domain: %s (%s), error %v; want none", state, reason, lastErr)
			}
			checkOneBoot(t, waitCounter(t, ctx, p.Src.Console(), before+3, "on the source after the failed migration"))
		})
	}
}

// TestAGuestThatDiedWhileItsDaemonWasDownEndsTheLauncher: a QEMU that exits while no libvirtd
// watches it (killed with its daemon down) is found gone by the restarted daemon, and the
// launcher ends saying the guest crashed: nothing watches a dead guest for ever.
func TestAGuestThatDiedWhileItsDaemonWasDownEndsTheLauncher(t *testing.T) {
	p := migrationpair.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout)
	defer cancel()
	s, err := openSession(ctx, p.Src.Daemon, NewNotifier(filepath.Join(t.TempDir(), "none"), notify.VMIRef{}, quietLog()), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name := p.RunGuest(t, ctx, testVMI(t, "died"), domain.TCG)
	qemu, err := p.Src.Daemon.QEMUPid(name)
	if err != nil {
		t.Fatal(err)
	}
	ended := watchInBackground(ctx, s, name)
	killDaemon(t, ctx, p.Src.Daemon)
	if err := syscall.Kill(qemu, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ended:
		if r.code != contract.ExitCrashed || r.err != nil {
			t.Errorf("the launcher returned %d, %v; want %d (crashed)", r.code, r.err, contract.ExitCrashed)
		}
	case <-time.After(time.Minute):
		t.Fatal("the launcher did not end a minute after its guest's QEMU was killed with its daemon down")
	}
	if s.Restarts() != 1 {
		t.Errorf("%d restarts of libvirtd, want 1", s.Restarts())
	}
}

// watched is how watchDomain ended: its exit code and error.
type watched struct {
	code int
	err  error
}

// watchInBackground runs watchDomain for the domain name of s (30 s grace, no pod network, no
// SIGTERM) and sends how it ended.
func watchInBackground(ctx context.Context, s *daemonSession, name string) <-chan watched {
	ended := make(chan watched, 1)
	go func() {
		code, err := watchDomain(ctx, s, name, 30, false, make(chan os.Signal), quietLog())
		ended <- watched{code, err}
	}()
	return ended
}
