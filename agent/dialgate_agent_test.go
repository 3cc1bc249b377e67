package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// countingDialer is the agent's real dialer, counting its attempts (each starts a libvirt client
// child) by launcher.
type countingDialer struct {
	mu    sync.Mutex
	dials map[string]int
}

func (d *countingDialer) count(uid string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[uid]
}

// A launcher that makes the agent's connections fail at once, or end just after they open, as
// fast as it can recreate its socket, gets a few libvirt client children started for it, not
// one for each: the agent spaces its connections out, counts the failures and says so on the
// VMI; a well-behaved launcher beside it connects at once all the same.
func TestAHostileLauncherCannotMakeTheAgentStartChildrenInALoop(t *testing.T) {
	needRoot(t)
	root, err := os.MkdirTemp("", "dialgate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	domains := filepath.Join(root, "domains")
	for _, d := range []string{domains, filepath.Join(domains, "refuses"), filepath.Join(domains, "restarts")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user := &domain.User{UID: contract.UID, GID: contract.GID}
	// "restarts" is a real daemon whose connections end just after they open: it is killed and
	// started again, with a new socket, over and over.
	restarts, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(root, "restarts-daemon"), SocketDir: filepath.Join(domains, "restarts"), User: user})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = restarts.Stop() })

	dialer := &countingDialer{dials: map[string]int{}}
	realDial := LibvirtDialer(filepath.Join(root, "relays"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	a := newFakeAgent(t, Config{NodeName: "node", DomainsDir: domains,
		Dial: func(ctx context.Context, socket, uid string) (DomainConn, error) {
			dialer.mu.Lock()
			dialer.dials[uid]++
			dialer.mu.Unlock()
			return realDial(ctx, socket, uid)
		}})
	metrics := a.metrics
	a.informers.Start(ctx.Done())
	go func() { _ = a.Run(ctx, 1) }()

	// "refuses" accepts each connection and closes it at once, on a socket it makes anew each
	// time, as a tenant's process in its launcher can.
	const hostileFor = 10 * time.Second
	hostileCtx, stopHostile := context.WithTimeout(ctx, hostileFor)
	defer stopHostile()
	var hostile sync.WaitGroup
	hostile.Add(2)
	go func() {
		defer hostile.Done()
		sock := filepath.Join(domains, "refuses", contract.LibvirtSocket)
		for hostileCtx.Err() == nil {
			_ = os.Remove(sock)
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Errorf("listening as the hostile launcher: %v", err)
				return
			}
			_ = os.Chmod(sock, 0o666)
			_ = l.(*net.UnixListener).SetDeadline(time.Now().Add(200 * time.Millisecond))
			if c, err := l.Accept(); err == nil {
				c.Close()
			}
			l.Close()
		}
	}()
	go func() {
		defer hostile.Done()
		for hostileCtx.Err() == nil {
			pid, err := restarts.DaemonPid()
			if err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			<-restarts.Done()
			if err := restarts.Restart(ctx); err != nil {
				t.Errorf("restarting the daemon: %v", err)
				return
			}
			select {
			case <-hostileCtx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()

	// A launcher that behaves, started meanwhile, is connected to at once.
	if err := os.Mkdir(filepath.Join(domains, "behaves"), 0o755); err != nil {
		t.Fatal(err)
	}
	behaves, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(root, "behaves-daemon"), SocketDir: filepath.Join(domains, "behaves"), User: user})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = behaves.Stop() })
	started := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c := a.conn("behaves")
		if c == nil {
			return false, nil
		}
		_, err := c.DomainNames(ctx)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the well-behaved launcher was not connected within 30 s beside the hostile ones")
	}
	t.Logf("the well-behaved launcher answered through the agent %s after its daemon started", time.Since(started).Round(time.Millisecond))
	hostile.Wait()

	// Unbounded, the refusing launcher gets a child every 200 ms at least (50 in 10 s) and the
	// restarting one a child per restart (about 30); spaced out 0.5 s doubling (at 0, 0.5, 1.5,
	// 3.5 and 7.5 s), each gets five.
	const most = 6
	for _, uid := range []string{"refuses", "restarts"} {
		if n := dialer.count(uid); n > most {
			t.Errorf("the agent started %d libvirt client children for launcher %q in %s, want at most %d", n, uid, hostileFor, most)
		} else {
			t.Logf("launcher %q: %d children in %s", uid, n, hostileFor)
		}
	}
	if n := testutil.ToFloat64(metrics.LauncherConnectFailures); n < 4 {
		t.Errorf("lifeboat_agent_launcher_connect_failures_total = %v, want the hostile launchers' failures counted", n)
	}
}
