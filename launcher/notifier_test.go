package launcher

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// agentStandIn accepts one connection and returns the kinds it reads until n arrive.
func readKinds(t *testing.T, l net.Listener, n int) []notify.Kind {
	t.Helper()
	_ = l.(*net.UnixListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("no connection from the notifier: %v", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var kinds []notify.Kind
	for len(kinds) < n {
		m, err := notify.Read(c)
		if err != nil {
			t.Fatalf("after %v: %v", kinds, err)
		}
		kinds = append(kinds, m.Kind)
	}
	return kinds
}

func TestNotifierReplaysHistoryAfterTheAgentRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	n := NewNotifier(path, notify.VMIRef{Namespace: "ns", Name: "vm", UID: "u"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// Reports made before any agent listens are kept.
	n.Report(notify.KindDomainStarted, time.Now(), 0, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.Run(ctx)

	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	got := readKinds(t, l, 2)
	if got[0] != notify.KindHello || got[1] != notify.KindDomainStarted {
		t.Fatalf("first agent got %v, want Hello, DomainStarted", got)
	}
	l.Close() // the agent goes away; its connection is closed by readKinds

	n.Report(notify.KindGracefulShutdown, time.Now(), 45, "")
	l, err = net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got = readKinds(t, l, 3)
	want := []notify.Kind{notify.KindHello, notify.KindDomainStarted, notify.KindGracefulShutdown}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("restarted agent got %v, want %v", got, want)
		}
	}
}
