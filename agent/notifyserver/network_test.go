package notifyserver

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// startNetworkServer serves a notify socket for VMI "u1" whose NetworkSetup requests h answers.
func startNetworkServer(t *testing.T, h NetworkHandler) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	s := New([]uint32{uint32(os.Getuid())}, func(*notify.Message, int32) {}, prometheus.NewRegistry(), slogDiscard())
	s.HandleNetwork(h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, path, msg(notify.KindHello, "u1").VMI) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	waitFor(t, "the socket to exist", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
	return s, path
}

// sendWithFDs writes m's frame with the descriptors beside it, as a launcher does.
func sendWithFDs(t *testing.T, c net.Conn, m *notify.Message, fds ...int) {
	t.Helper()
	var frame bytes.Buffer
	if err := notify.Write(&frame, m); err != nil {
		t.Fatal(err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(frame.Bytes(), oob, nil); err != nil {
		t.Fatal(err)
	}
}

func ownNetNS(t *testing.T) *os.File {
	t.Helper()
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func TestNetworkSetupIsAnsweredOnTheConnection(t *testing.T) {
	lease := &notify.Lease{Interface: "lb-br0", Tap: "lb-tap0", Address: "10.0.2.2/24", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 1500}
	gotType := make(chan int, 1)
	_, path := startNetworkServer(t, func(_ context.Context, ref notify.VMIRef, netns *os.File) (*notify.Lease, error) {
		kind, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_NSTYPE)
		if err != nil {
			kind = -1
		}
		gotType <- kind
		if ref.UID != "u1" {
			return nil, errors.New("wrong VMI")
		}
		return lease, nil
	})
	c := dial(t, path)
	defer c.Close()
	if err := notify.Write(c, msg(notify.KindHello, "u1")); err != nil {
		t.Fatal(err)
	}
	sendWithFDs(t, c, msg(notify.KindNetworkSetup, "u1"), int(ownNetNS(t).Fd()))
	reply, err := notify.Read(c)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Kind != notify.KindNetworkReady || reply.Lease == nil || *reply.Lease != *lease {
		t.Errorf("reply %+v, want NetworkReady with %+v", reply, lease)
	}
	if kind := <-gotType; kind != unix.CLONE_NEWNET {
		t.Errorf("the handler got a descriptor of namespace type %d, want a network namespace", kind)
	}
}

func TestNetworkSetupFailureIsAnswered(t *testing.T) {
	_, path := startNetworkServer(t, func(context.Context, notify.VMIRef, *os.File) (*notify.Lease, error) {
		return nil, errors.New("no bridge today")
	})
	c := dial(t, path)
	defer c.Close()
	if err := notify.Write(c, msg(notify.KindHello, "u1")); err != nil {
		t.Fatal(err)
	}
	sendWithFDs(t, c, msg(notify.KindNetworkSetup, "u1"), int(ownNetNS(t).Fd()))
	reply, err := notify.Read(c)
	if err != nil || reply.Kind != notify.KindNetworkFailed || reply.Reason != "no bridge today" {
		t.Errorf("reply %+v, %v; want NetworkFailed with the handler's reason", reply, err)
	}
}

// Descriptors where none belong, or more than one, cost the connection.
func TestMisplacedDescriptorsCloseTheConnection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		send   func(t *testing.T, c net.Conn, ns int)
		reason string
	}{
		{"NetworkSetup without a namespace", func(t *testing.T, c net.Conn, _ int) {
			sendWithFDs(t, c, msg(notify.KindNetworkSetup, "u1"))
		}, "no-namespace"},
		{"a descriptor with another message", func(t *testing.T, c net.Conn, ns int) {
			sendWithFDs(t, c, msg(notify.KindDomainStarted, "u1"), ns)
		}, "unexpected-descriptor"},
		{"two descriptors", func(t *testing.T, c net.Conn, ns int) {
			sendWithFDs(t, c, msg(notify.KindNetworkSetup, "u1"), ns, ns)
		}, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			s, path := startNetworkServer(t, func(context.Context, notify.VMIRef, *os.File) (*notify.Lease, error) {
				called = true
				return &notify.Lease{}, nil
			})
			c := dial(t, path)
			defer c.Close()
			if err := notify.Write(c, msg(notify.KindHello, "u1")); err != nil {
				t.Fatal(err)
			}
			tc.send(t, c, int(ownNetNS(t).Fd()))
			if !closed(t, c) {
				t.Fatal("the connection stayed open")
			}
			if n := testutil.ToFloat64(s.rejected.WithLabelValues(tc.reason)); n != 1 || called {
				t.Errorf("rejected{reason=%q} = %v, handler called %v; want 1 and not called", tc.reason, n, called)
			}
		})
	}
}
