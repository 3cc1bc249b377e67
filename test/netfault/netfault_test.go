package netfault

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// peer is the address the tests listen on: in 127.0.0.0/8, away from the emulated nodes' (from 127.0.0.11 up).
var peer = netip.MustParseAddr("127.0.0.251")

// send has a new process in group g send n bytes to addr (shell's /dev/tcp), giving up after
// 5 s; it returns whether all were sent and how long that took.
func send(t *testing.T, f *Faults, g string, addr string, n int) (bool, time.Duration) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	// bash forks nothing before its line comes: what it starts then is in the group with it.
	cmd := exec.Command("bash", "-c", "read; exec timeout 5 bash -c 'head -c "+strconv.Itoa(n)+" /dev/zero > /dev/tcp/"+host+"/"+port+"'")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// It waits for its line until it is in the group: its sockets are the group's.
	if err := f.Join(g, cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	start := time.Now()
	_, _ = stdin.Write([]byte("go\n"))
	err = cmd.Wait()
	return err == nil, time.Since(start)
}

// received is what one connection brought: its bytes, from its acceptance to its end.
type received struct {
	n    int64
	took time.Duration
}

// listen accepts connections on peer and says what each brought.
func listen(t *testing.T) (string, <-chan received) {
	t.Helper()
	got := make(chan received, 16)
	l, err := net.Listen("tcp", net.JoinHostPort(peer.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				start := time.Now()
				n, _ := io.Copy(io.Discard, c)
				got <- received{n, time.Since(start)}
			}()
		}
	}()
	return l.Addr().String(), got
}

// newFaults makes the test's Faults, or fails saying what the machine lacks: make test and .ci/run
// run as root on a machine with cgroup v2 and nftables (README, Prerequisites), where these
// tests must run, not be skipped.
func newFaults(t *testing.T) *Faults {
	t.Helper()
	f, err := New()
	if err != nil {
		t.Fatalf("network faults need root, a cgroup v2 hierarchy and nftables, as make test and .ci/run have them: %v", err)
	}
	return f
}

// A cut drops what the group's processes send to the address, and only that; healing ends it;
// a slowed one gets through at about its rate.
func TestCutSlowAndHeal(t *testing.T) {
	f := newFaults(t)
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
	})
	addr, got := listen(t)
	if ok, took := send(t, f, "a", addr, 1<<20); !ok || took > 2*time.Second {
		t.Fatalf("before any fault: sent %v in %s", ok, took)
	}
	if err := f.Cut("a", peer); err != nil {
		t.Fatal(err)
	}
	if ok, _ := send(t, f, "a", addr, 1); ok {
		t.Error("group a's process connected through the cut")
	}
	if ok, _ := send(t, f, "b", addr, 1); !ok {
		t.Error("group b's process was cut too")
	}
	// Nor this process, which is in no group.
	c, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Errorf("the test process was cut: %v", err)
	} else {
		c.Close()
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := send(t, f, "a", addr, 1); !ok {
		t.Error("group a still cut after healing")
	}
	const rate = 512 << 10
	if err := f.Slow("a", rate, peer); err != nil {
		t.Fatal(err)
	}
	for len(got) > 0 {
		<-got
	}
	// A MiB at 512 KiB/s takes about two seconds at the receiver (the sender is done once its
	// socket's buffer holds it all), less its burst and what TCP's retransmissions round: well
	// over the milliseconds loopback takes unslowed.
	if ok, _ := send(t, f, "a", addr, 1<<20); !ok {
		t.Fatal("the slowed send failed")
	}
	select {
	case r := <-got:
		if r.n != 1<<20 || r.took < 700*time.Millisecond {
			t.Errorf("slowed to %d B/s, a MiB: %d bytes in %s", rate, r.n, r.took)
		}
		t.Logf("slowed to %d B/s: %d bytes in %s", rate, r.n, r.took.Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Error("the slowed MiB did not arrive within 10 s")
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
}

// A process joined to a group may start others there (an agent its libvirt client children):
// Close takes them out with it, and the groups go.
func TestCloseTakesOutWhatTheGroupsProcessesStarted(t *testing.T) {
	f := newFaults(t)
	// bash starts its child only once its line comes, in the group by then; the child outlives it.
	cmd := exec.Command("bash", "-c", "read; sleep 30 >/dev/null & echo $!")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := f.Join("g", cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	_, _ = stdin.Write([]byte("go\n"))
	line, _ := io.ReadAll(out)
	_ = cmd.Wait()
	child, err := strconv.Atoi(strings.TrimSpace(string(line)))
	if err != nil {
		t.Fatalf("the child's pid: %q", line)
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if err := f.Close(); err != nil {
		t.Fatalf("Close with a child of a joined process still in its group: %v", err)
	}
	if group, err := cgroupOf(child); err != nil || strings.Contains(group, f.name) {
		t.Errorf("the child is in %q after Close (%v), want it out of %s", group, err, f.name)
	}
}
