package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// TestTheAgentReconnectsToARestartedLauncherDaemon: when a launcher's libvirtd is killed and the
// launcher starts it again, the agent's connection to it (through its relay) ends, and the
// agent connects to the new daemon on its own, from the socket the new daemon makes.
func TestTheAgentReconnectsToARestartedLauncherDaemon(t *testing.T) {
	needRoot(t)
	// Short paths: a unix socket's path holds 107 bytes.
	root, err := os.MkdirTemp("", "restart")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil { // the daemon's user reaches its directory
		t.Fatal(err)
	}
	const uid = "restarted"
	domains := filepath.Join(root, "domains")
	if err := os.Mkdir(domains, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	daemon, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(root, "daemon"), SocketDir: filepath.Join(domains, uid),
		User: &domain.User{UID: contract.UID, GID: contract.GID}})
	if err != nil {
		t.Fatalf("starting the launcher's libvirtd: %v", err)
	}
	t.Cleanup(func() { _ = daemon.Stop() })

	a := newFakeAgent(t, Config{NodeName: "node", DomainsDir: domains, Dial: LibvirtDialer(filepath.Join(root, "relays"), slog.New(slog.NewTextHandler(io.Discard, nil)))})
	a.informers.Start(ctx.Done())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx, 1) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			select {
			case err := <-errc:
				t.Fatalf("the agent ended while waiting for %s: %v", what, err)
			default:
			}
			return cond(), nil
		})
		if err != nil {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
	answers := func() bool {
		c := a.conn(uid)
		if c == nil {
			return false
		}
		_, err := c.DomainNames(ctx)
		return err == nil
	}
	waitFor("the agent connected to the launcher's libvirt", answers)

	pid, err := daemon.DaemonPid()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-daemon.Done()
	waitFor("the agent saw its connection to the killed daemon end", func() bool { return !a.connected(uid) })
	if err := daemon.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("the agent connected to the restarted daemon", answers)

	// Restarted at once, the daemon's new socket may appear before the agent has seen its
	// connection to the old one end: it connects to the new one all the same.
	if pid, err = daemon.DaemonPid(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-daemon.Done()
	if err := daemon.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("the agent connected to the daemon restarted at once", answers)
}
