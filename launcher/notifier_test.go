package launcher

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/notify"
	"os"
	"syscall"
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

// agentThatTells accepts the notifier's connection, reads its hello and hands the connection
// and the agent's socket to tell, as the source agent does when a migrated guest's handover ends.
func agentThatTells(t *testing.T, tell func(c net.Conn, l net.Listener)) (ctx context.Context, n *Notifier) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ref := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "u"}
	n = NewNotifier(path, ref, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go n.Run(ctx)
	_ = l.(*net.UnixListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("no connection from the notifier: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := notify.Read(c); err != nil || m.Kind != notify.KindHello {
		t.Fatalf("the notifier's first message: %v, %v", m, err)
	}
	tell(c, l)
	return ctx, n
}

// awaitsHandover runs awaitHandover and fails unless it returns well before HandoverAtMost.
func awaitsHandover(t *testing.T, ctx context.Context, n *Notifier, why string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		awaitHandover(ctx, n, notify.HandoverAtMost, nil, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the launcher still waited 10 s after %s (it would wait %s)", why, notify.HandoverAtMost)
	}
}

// A source launcher whose guest left keeps its pod until the agent says it is no longer needed,
// and heeds only what names its own VMI.
func TestALauncherWaitsForItsHandoverToEnd(t *testing.T) {
	var c net.Conn
	ctx, n := agentThatTells(t, func(conn net.Conn, _ net.Listener) { c = conn })
	other := &notify.Message{Kind: notify.KindHandoverDone, VMI: notify.VMIRef{Namespace: "ns", Name: "other", UID: "o"}, Time: time.Now()}
	if err := notify.Write(c, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.HandoverDone():
		t.Fatal("another VMI's HandoverDone released this launcher")
	case <-time.After(500 * time.Millisecond):
	}
	own := &notify.Message{Kind: notify.KindHandoverDone, VMI: notify.VMIRef{Namespace: "ns", Name: "vm", UID: "u"}, Time: time.Now(), Reason: "the source pod's forward ended"}
	if err := notify.Write(c, own); err != nil {
		t.Fatal(err)
	}
	awaitsHandover(t, ctx, n, "the agent said the pod is no longer needed")
	select {
	case <-n.HandoverDone():
	default:
		t.Error("the launcher stopped waiting, but not because the agent said so")
	}
}

// An agent that goes away will not say it: the launcher stops waiting when the connection it
// waited on ends and no agent listens.
func TestALauncherStopsWaitingWhenItsAgentGoes(t *testing.T) {
	ctx, n := agentThatTells(t, func(c net.Conn, l net.Listener) {
		l.Close()
		c.Close()
	})
	awaitsHandover(t, ctx, n, "the agent's connection ended")
	select {
	case <-n.HandoverDone():
		t.Error("the launcher counts a lost agent as one that said the pod is no longer needed")
	default:
	}
}

// A pod being terminated (a kubelet's eviction, a drain) must end well before its SIGKILL: the
// wait for the agent's word lasts at most what is left of the first half of the grace period.
func TestHandoverBound(t *testing.T) {
	now := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		terminating time.Time
		grace       int64
		want        time.Duration
	}{
		{"not terminating", time.Time{}, 60, notify.HandoverAtMost},
		{"terminating since 10 s, grace 60 s", now.Add(-10 * time.Second), 60, 20 * time.Second},
		{"half the grace gone already", now.Add(-40 * time.Second), 60, 0},
		{"a long grace", now, 3600, notify.HandoverAtMost},
	} {
		if got := handoverBound(tc.terminating, tc.grace, now); got != tc.want {
			t.Errorf("%s: handoverBound = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A SIGTERM while the launcher waits (a drain evicting the pod its guest left) bounds the wait
// to half the pod's grace period from then.
func TestASIGTERMBoundsTheWaitForTheHandover(t *testing.T) {
	ctx, n := agentThatTells(t, func(net.Conn, net.Listener) {})
	sigterm := make(chan os.Signal, 1)
	sigterm <- syscall.SIGTERM
	start := time.Now()
	done := make(chan struct{})
	go func() {
		awaitHandover(ctx, n, notify.HandoverAtMost, sigterm, 2, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the launcher still waited 10 s after a SIGTERM with a grace period of 2 s")
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("the launcher stopped waiting after %s, before half its grace period (1 s)", took)
	}
}

// The agent's question about the guest's memory is answered on the same connection with what the
// launcher reads, once per question and only for its own VMI.
func TestALauncherAnswersHowMuchOfItsGuestsMemoryIsResident(t *testing.T) {
	var c net.Conn
	_, n := agentThatTells(t, func(conn net.Conn, _ net.Listener) { c = conn })
	ref := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "u"}
	ask := func(vmi notify.VMIRef) {
		t.Helper()
		if err := notify.Write(c, &notify.Message{Kind: notify.KindGuestMemoryQuery, VMI: vmi, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	var reads atomic.Uint64
	n.AnswerGuestMemory(func() (uint64, uint64, error) {
		return reads.Add(1) << 20, 1 << 30, nil
	})
	ask(notify.VMIRef{Namespace: "ns", Name: "other", UID: "o"})
	ask(ref)
	ask(ref)
	for want := uint64(1); want <= 2; want++ {
		m, err := notify.Read(c)
		if err != nil {
			t.Fatal(err)
		}
		if m.Kind != notify.KindGuestMemory || m.VMI != ref || m.GuestMemoryResidentBytes != want<<20 || m.GuestMemoryBytes != 1<<30 {
			t.Fatalf("answer %d: %+v; want GuestMemory of %d MiB resident of 1 GiB", want, m, want)
		}
	}
	n.Report(notify.KindDomainStarted, time.Now(), 0, "")
	if m, err := notify.Read(c); err != nil || m.Kind != notify.KindDomainStarted {
		t.Fatalf("after the answers: %+v, %v; want the DomainStarted report, no answer to another VMI's question", m, err)
	}
	if r := reads.Load(); r != 2 {
		t.Errorf("the guest's memory was read %d times for two questions of its own", r)
	}
}
