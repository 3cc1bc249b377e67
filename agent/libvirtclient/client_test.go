package libvirtclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/domain"
)

// fakeChild stands in for a child at the other end of a client's pipes: answer is what it sends
// back for each request it reads; if exits, it ends its output after the first.
type fakeChild struct {
	client *Client
	killed atomic.Bool
}

func startFakeChild(t *testing.T, answer func(req request) string, exits bool, onEvent func(domain.Event)) *fakeChild {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	f := &fakeChild{}
	f.client = newClient(outR, inW, func() {
		f.killed.Store(true)
		_ = inR.Close()
		_ = outW.Close()
	}, onEvent)
	go func() {
		r := bufio.NewReader(inR)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var req request
			if err := json.Unmarshal(line, &req); err != nil {
				t.Errorf("the client sent a request that is not JSON: %q", line)
				return
			}
			if _, err := io.WriteString(outW, answer(req)); err != nil || exits {
				_ = outW.Close()
				return
			}
		}
	}()
	t.Cleanup(func() { f.client.Cut() })
	return f
}

// healthy answers DomainNames with one domain.
func healthy(req request) string {
	return fmt.Sprintf(`{"id":%d,"result":["ns_vm"]}`+"\n", req.ID)
}

// A child that breaks the protocol, with a message over the bound or one the agent cannot read,
// ends its own connection: the call fails with an error that says why, the child is killed, and
// the agent's other connections go on as before.
func TestAChildThatBreaksTheProtocolEndsItsConnectionOnly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(req request) string
		exits  bool
		want   string
	}{
		{"oversized", func(request) string { return strings.Repeat("x", MaxMessage+1) + "\n" }, false, ErrMessageTooLong.Error()},
		{"oversized without end", func(request) string { return `{"id":1,"result":["` + strings.Repeat("a", 2*MaxMessage) }, false, ErrMessageTooLong.Error()},
		{"not JSON", func(request) string { return "{not json\n" }, false, "a malformed message"},
		{"answer to no request", func(req request) string { return fmt.Sprintf(`{"id":%d,"result":[]}`+"\n", req.ID+7) }, false, "which does not wait for one"},
		{"neither answer nor event", func(request) string { return "{}\n" }, false, "answers no request and is no event"},
		{"result of the wrong type", func(req request) string { return fmt.Sprintf(`{"id":%d,"result":{"a":1}}`+"\n", req.ID) }, false, "a malformed result of domain-names"},
		{"ends mid-message", func(req request) string { return fmt.Sprintf(`{"id":%d,"res`, req.ID) }, true, io.ErrUnexpectedEOF.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good := startFakeChild(t, healthy, false, nil)
			bad := startFakeChild(t, tc.answer, tc.exits, nil)
			errc := make(chan error, 1)
			go func() { _, err := bad.client.DomainNames(); errc <- err }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("the call to a child that broke the protocol still waits after 10 s")
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the libvirt client's connection ended") {
				t.Fatalf("the call: %v; want the connection ended with %q", err, tc.want)
			}
			select {
			case <-bad.client.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the broken connection is not done 10 s after it ended")
			}
			if !bad.killed.Load() {
				t.Error("the child that broke the protocol was not killed")
			}
			if _, err := bad.client.DomainNames(); err == nil {
				t.Error("a call on the ended connection succeeded")
			}
			for range 3 {
				if names, err := good.client.DomainNames(); err != nil || len(names) != 1 || names[0] != "ns_vm" {
					t.Fatalf("the other connection after one broke: %v, %v; want [ns_vm]", names, err)
				}
			}
			if good.killed.Load() {
				t.Error("the other connection's child was killed")
			}
		})
	}
}

// Events come in order between answers, and a migration's context reaches the child as a cancel
// of its request, whose answer then wraps the context's error.
func TestEventsAndACancelledMigration(t *testing.T) {
	var events []domain.Event
	cancelled := make(chan uint64, 1)
	f := startFakeChild(t, func(req request) string {
		switch req.Op {
		case opMigrate:
			return `{"event":{"Domain":"ns_vm","Type":"Suspended","State":"Paused","Reason":"Migration"}}` + "\n"
		case opCancel:
			cancelled <- req.Target
			return fmt.Sprintf(`{"id":%d,"error":{"message":"migrating domain \"ns_vm\": context canceled","cancelled":true}}`+"\n", req.Target)
		}
		return fmt.Sprintf(`{"id":%d,"error":{"message":"no such domain","notFound":true}}`+"\n", req.ID)
	}, false, func(ev domain.Event) { events = append(events, ev) })
	if _, err := f.client.Lookup("gone"); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("looking up a domain the child did not find: %v; want %v", err, domain.ErrNotFound)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- f.client.Migrate(ctx, "ns_vm", domain.MigrateOptions{DestURI: "d", MigrateURI: "m"}) }()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled migration: %v; want it to wrap %v", err, context.Canceled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled migration has not returned after 10 s")
	}
	if id := <-cancelled; id == 0 {
		t.Error("the cancel named no request")
	}
	if len(events) != 1 || events[0].Type != domain.EventSuspended || events[0].Reason != domain.ReasonMigration {
		t.Errorf("events: %+v; want the migration's pause", events)
	}
}

func TestConfinementProblem(t *testing.T) {
	nobody := [6]int{ChildUID, ChildUID, ChildUID, ChildGID, ChildGID, ChildGID}
	for _, tc := range []struct {
		name   string
		caps   [2]unix.CapUserData
		ids    [6]int
		groups []int
		ok     bool
	}{
		{"confined", [2]unix.CapUserData{}, nobody, nil, true},
		{"an effective capability", [2]unix.CapUserData{{Effective: 1 << unix.CAP_SYS_ADMIN}}, nobody, nil, false},
		{"a permitted capability in the upper word", [2]unix.CapUserData{{}, {Permitted: 1}}, nobody, nil, false},
		{"an inheritable capability", [2]unix.CapUserData{{Inheritable: 1 << unix.CAP_NET_ADMIN}}, nobody, nil, false},
		{"saved root", [2]unix.CapUserData{}, [6]int{ChildUID, ChildUID, 0, ChildGID, ChildGID, ChildGID}, nil, false},
		{"the launchers' group", [2]unix.CapUserData{}, [6]int{ChildUID, ChildUID, ChildUID, 107, 107, 107}, nil, false},
		{"a supplementary group", [2]unix.CapUserData{}, nobody, []int{0}, false},
	} {
		err := confinementProblem(tc.caps, tc.ids, tc.groups)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v; want ok=%t", tc.name, err, tc.ok)
		}
	}
}

// The child's standard error reaches the agent's log a line at a time, each line cut at
// maxStderrLine bytes, and no more than maxStderrLines lines of it.
func TestTheChildsStandardErrorIsLoggedLineByLineWithinBounds(t *testing.T) {
	var out strings.Builder
	log := slog.New(slog.NewJSONHandler(&out, nil)).With("vmiUID", "u")
	var in strings.Builder
	in.WriteString("libvirt: error one\n")
	in.WriteString(strings.Repeat("y", 3*maxStderrLine) + "\n")
	for i := range maxStderrLines + 50 {
		fmt.Fprintf(&in, "line %d\n", i)
	}
	forwardStderr(io.NopCloser(strings.NewReader(in.String())), log)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line that is not JSON: %q", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != maxStderrLines+1 {
		t.Fatalf("%d log lines, want %d and a last one saying the rest is dropped", len(lines), maxStderrLines+1)
	}
	if lines[0]["line"] != "libvirt: error one" || lines[0]["vmiUID"] != "u" {
		t.Errorf("the first log line: %v", lines[0])
	}
	if long := lines[1]["line"].(string); len(long) != maxStderrLine || lines[1]["cut"] != true {
		t.Errorf("the long line was logged with %d bytes (cut %v), want %d, cut", len(long), lines[1]["cut"], maxStderrLine)
	}
	if lines[2]["line"] != "line 0" {
		t.Errorf("the line after the long one: %v; want line 0", lines[2])
	}
	if !strings.Contains(lines[maxStderrLines]["msg"].(string), "dropped") {
		t.Errorf("the last log line: %v; want it to say the rest is dropped", lines[maxStderrLines])
	}
}

// Whatever a child sends, the agent's end neither panics nor waits for ever: a call gets an
// answer or an error once the child's output ends.
func FuzzTheChildsReplies(f *testing.F) {
	for _, seed := range []string{
		`{"id":1,"result":["ns_vm"]}` + "\n" + `{"id":2,"result":{"dataRemaining":5}}` + "\n",
		`{"event":{"domain":"ns_vm","type":"Stopped"}}` + "\n" + `{"id":1,"result":[]}` + "\n",
		`{"id":1,"error":{"message":"gone","notFound":true}}` + "\n",
		`{"id":2,"result":null}` + "\n",
		"{\"id\":1,\"result\":[\"" + strings.Repeat("a", 100) + "\"]}\n",
		"\n\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		c := newClient(outR, inW, func() {
			_ = inR.Close()
			_ = outW.Close()
		}, nil)
		defer c.Cut()
		go func() {
			// The child reads the first request, then writes out and ends.
			_, _ = bufio.NewReader(inR).ReadBytes('\n')
			_, _ = outW.Write(out)
			_ = outW.Close()
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := c.DomainNames(); err != nil {
				return
			}
			_, _ = c.JobStats("ns_vm")
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("a call still waits 10 s after the child's output %q ended", out)
		}
	})
}
