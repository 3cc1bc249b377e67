package notifyserver

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

type received struct {
	mu   sync.Mutex
	msgs []*notify.Message
	pids []int32
}

func (r *received) handle(m *notify.Message, pid int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	r.pids = append(r.pids, pid)
}

func (r *received) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// startServer serves a notify socket for the VMI ns/vm with vmiUID.
func startServer(t *testing.T, uids []uint32, vmiUID string, configure ...func(*Server, *received)) (*Server, string, *received) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	got := &received{}
	s := New(uids, got.handle, prometheus.NewRegistry(), slogDiscard())
	for _, c := range configure {
		c(s, got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, path, msg(notify.KindHello, vmiUID).VMI) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	// Probing with a connection would itself count as a rejection in some tests.
	waitFor(t, "the socket to exist", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
	return s, path, got
}

// dial connects, retrying briefly: the socket file exists a moment before the server listens.
func dial(t *testing.T, path string) net.Conn {
	t.Helper()
	var c net.Conn
	waitFor(t, "a connection to "+path, func() bool {
		var err error
		c, err = net.Dial("unix", path)
		return err == nil
	})
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func msg(kind notify.Kind, uid string) *notify.Message {
	return &notify.Message{Kind: kind, VMI: notify.VMIRef{Namespace: "ns", Name: "vm", UID: uid}, Time: time.Now()}
}

// closed reports whether the server closed the connection.
func closed(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !os.IsTimeout(err)
}

func TestValidMessagesReachTheHandlerWithThePeerPID(t *testing.T) {
	_, path, got := startServer(t, []uint32{uint32(os.Getuid())}, "u1")
	c := dial(t, path)
	defer c.Close()
	for _, k := range []notify.Kind{notify.KindHello, notify.KindDomainStarted, notify.KindGracefulShutdown} {
		if err := notify.Write(c, msg(k, "u1")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three messages", func() bool { return got.count() == 3 })
	if got.pids[0] != int32(os.Getpid()) {
		t.Errorf("peer pid = %d, want ours (%d)", got.pids[0], os.Getpid())
	}
	if got.msgs[2].Kind != notify.KindGracefulShutdown {
		t.Errorf("third message = %s", got.msgs[2].Kind)
	}
}

func TestBadConnectionsAreClosedAloneAndCounted(t *testing.T) {
	header := func(version byte, n uint16) []byte {
		b := []byte{version, 0, 0, 0}
		binary.BigEndian.PutUint16(b[2:], n)
		return b
	}
	cases := []struct {
		name   string
		send   func(c net.Conn)
		reason string
	}{
		{"oversized frame", func(c net.Conn) { _, _ = c.Write(header(notify.Version, 0xffff)) }, "oversized"},
		{"wrong version", func(c net.Conn) { _, _ = c.Write(append(header(9, 2), "{}"...)) }, "version"},
		{"garbage body", func(c net.Conn) { _, _ = c.Write(append(header(notify.Version, 4), "!!!!"...)) }, "malformed"},
		{"no hello first", func(c net.Conn) { _ = notify.Write(c, msg(notify.KindGracefulShutdown, "good")) }, "no-hello"},
		// The socket is in one launcher's directory: a hello for another VMI is a lie.
		{"hello for another VMI", func(c net.Conn) { _ = notify.Write(c, msg(notify.KindHello, "u2")) }, "wrong-vmi"},
		// Nor may it name another VMI with its own UID: what the agent writes for a launcher's
		// reports is the VMI the hello names.
		{"hello with its UID for a VMI of another namespace", func(c net.Conn) {
			m := msg(notify.KindHello, "good")
			m.VMI.Namespace = "victims"
			_ = notify.Write(c, m)
		}, "wrong-vmi"},
		{"hello with its UID for another VMI's name", func(c net.Conn) {
			m := msg(notify.KindHello, "good")
			m.VMI.Name = "victim"
			_ = notify.Write(c, m)
		}, "wrong-vmi"},
		// What the agent tells a launcher is the agent's to say.
		{"a message only the agent sends", func(c net.Conn) {
			_ = notify.Write(c, msg(notify.KindHello, "good"))
			_ = notify.Write(c, msg(notify.KindHandoverDone, "good"))
		}, "agent-kind"},
		// Capabilities go from the agent to launchers, never the other way.
		{"a launcher offering QEMU capabilities", func(c net.Conn) {
			_ = notify.Write(c, msg(notify.KindHello, "good"))
			_ = notify.Write(c, msg(notify.KindQEMUCapabilitiesFile, "good"))
		}, "agent-kind"},
		// The agent asks about a guest's memory; a launcher only answers.
		{"a launcher asking about guest memory", func(c net.Conn) {
			_ = notify.Write(c, msg(notify.KindHello, "good"))
			_ = notify.Write(c, msg(notify.KindGuestMemoryQuery, "good"))
		}, "agent-kind"},
		{"another VMI after hello", func(c net.Conn) {
			_ = notify.Write(c, msg(notify.KindHello, "good"))
			_ = notify.Write(c, msg(notify.KindGracefulShutdown, "u2"))
		}, "vmi-mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, path, got := startServer(t, []uint32{uint32(os.Getuid())}, "good")
			good := dial(t, path)
			defer good.Close()
			if err := notify.Write(good, msg(notify.KindHello, "good")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the good hello", func() bool { return got.count() == 1 })

			bad := dial(t, path)
			defer bad.Close()
			tc.send(bad)
			if !closed(t, bad) {
				t.Fatal("the server kept the bad connection open")
			}
			if n := testutil.ToFloat64(s.rejected.WithLabelValues(tc.reason)); n != 1 {
				t.Errorf("rejected{reason=%q} = %v, want 1", tc.reason, n)
			}
			// The other launcher's connection is unaffected.
			if err := notify.Write(good, msg(notify.KindDomainStarted, "good")); err != nil {
				t.Fatalf("the good connection broke: %v", err)
			}
			waitFor(t, "the good connection's next message", func() bool {
				got.mu.Lock()
				defer got.mu.Unlock()
				return got.msgs[len(got.msgs)-1].Kind == notify.KindDomainStarted && got.msgs[len(got.msgs)-1].VMI.UID == "good"
			})
			got.mu.Lock()
			defer got.mu.Unlock()
			for _, m := range got.msgs {
				if m.VMI != msg(notify.KindHello, "good").VMI {
					t.Errorf("the handler got a %s for %s from the socket of ns/vm (good)", m.Kind, m.VMI)
				}
			}
		})
	}
}

func TestUnauthorisedPeerIsRejected(t *testing.T) {
	s, path, got := startServer(t, []uint32{uint32(os.Getuid()) + 4242}, "u1")
	c := dial(t, path)
	defer c.Close()
	_ = notify.Write(c, msg(notify.KindHello, "u1"))
	if !closed(t, c) {
		t.Fatal("a peer with a uid not allowed was served")
	}
	if n := testutil.ToFloat64(s.rejected.WithLabelValues("unauthorised")); n != 1 {
		t.Errorf("rejected{reason=unauthorised} = %v, want 1", n)
	}
	if got.count() != 0 {
		t.Errorf("the handler got %d messages from an unauthorised peer", got.count())
	}
}

// TestConnectionsPerSocketAreBounded: a launcher that opens connection after connection gets
// MaxConnsPerSocket of them; the next is closed at once and counted, and a slot freed by a
// closed connection serves again.
func TestConnectionsPerSocketAreBounded(t *testing.T) {
	s, path, got := startServer(t, []uint32{uint32(os.Getuid())}, "u1")
	var open []net.Conn
	for i := range MaxConnsPerSocket {
		c := dial(t, path)
		defer c.Close()
		if err := notify.Write(c, msg(notify.KindHello, "u1")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("hello %d served", i+1), func() bool { return got.count() == i+1 })
		open = append(open, c)
	}
	extra := dial(t, path)
	defer extra.Close()
	if !closed(t, extra) {
		t.Fatalf("connection %d was served; want it closed", MaxConnsPerSocket+1)
	}
	if n := testutil.ToFloat64(s.rejected.WithLabelValues("too-many-connections")); n != 1 {
		t.Errorf("rejected{reason=too-many-connections} = %v, want 1", n)
	}
	open[0].Close()
	waitFor(t, "a freed slot to serve a new connection", func() bool {
		c, err := net.Dial("unix", path)
		if err != nil {
			return false
		}
		defer c.Close()
		before := got.count()
		if notify.Write(c, msg(notify.KindHello, "u1")) != nil {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, _ = c.Read(make([]byte, 1))
		return got.count() > before
	})
}

// TestACleanEndIsReportedAfterEveryMessage: when a launcher's connection ends, the end handler
// hears of it after the handler had every message sent before; a connection refused before
// its hello is no launcher's end.
func TestACleanEndIsReportedAfterEveryMessage(t *testing.T) {
	var mu sync.Mutex
	var ends []string
	var seenAtEnd int
	_, path, _ := startServer(t, []uint32{uint32(os.Getuid())}, "u1", func(s *Server, got *received) {
		s.HandleEnd(func(uid string) {
			mu.Lock()
			defer mu.Unlock()
			ends, seenAtEnd = append(ends, uid), got.count()
		})
	})
	liar := dial(t, path)
	_ = notify.Write(liar, msg(notify.KindHello, "u2"))
	waitFor(t, "the liar cut off", func() bool { return closed(t, liar) })

	c := dial(t, path)
	for _, k := range []notify.Kind{notify.KindHello, notify.KindDomainGone} {
		if err := notify.Write(c, msg(k, "u1")); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	waitFor(t, "the end reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(ends) > 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != 1 || ends[0] != "u1" {
		t.Fatalf("ends reported for %v, want only u1's", ends)
	}
	if seenAtEnd != 2 {
		t.Fatalf("the end came after %d handled messages, want both", seenAtEnd)
	}
}

// Tell reaches the launcher's connections past their hello, and only its own: what the source
// agent tells the launcher whose guest left (that its pod is no longer needed).
func TestTellReachesOnlyThatVMIsLauncher(t *testing.T) {
	uids := []uint32{uint32(os.Getuid())}
	s, path, got := startServer(t, uids, "good")
	// A second socket for another VMI, on the same server, as an agent serves one per launcher.
	other := filepath.Join(t.TempDir(), "notify.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, other, msg(notify.KindHello, "other").VMI) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	if s.Tell("good", msg(notify.KindHandoverDone, "good")) {
		t.Error("Tell reported a launcher that was not connected as told")
	}
	launcher, bystander := dial(t, path), dial(t, other)
	defer launcher.Close()
	defer bystander.Close()
	for c, uid := range map[net.Conn]string{launcher: "good", bystander: "other"} {
		if err := notify.Write(c, msg(notify.KindHello, uid)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both hellos", func() bool { return got.count() == 2 })
	if !s.Tell("good", msg(notify.KindHandoverDone, "good")) {
		t.Fatal("Tell did not reach the connected launcher")
	}
	_ = launcher.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, err := notify.Read(launcher)
	if err != nil {
		t.Fatalf("the launcher read nothing: %v", err)
	}
	if m.Kind != notify.KindHandoverDone || m.VMI.UID != "good" {
		t.Errorf("the launcher read %s for %s, want HandoverDone for good", m.Kind, m.VMI)
	}
	_ = bystander.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := bystander.Read(make([]byte, 1)); !os.IsTimeout(err) {
		t.Errorf("the other VMI's launcher read something, or its connection ended: %v", err)
	}
}
