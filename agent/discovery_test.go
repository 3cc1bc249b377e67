package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

func TestDiscoverFindsExistingAndNewLaunchers(t *testing.T) {
	root := t.TempDir()
	listen := func(uid string) net.Listener {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, uid), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", filepath.Join(root, uid, contract.LibvirtSocket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	listen("existing")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	found, gone := make(chan string, 10), make(chan string, 10)
	errc := make(chan error, 1)
	go func() { errc <- discover(ctx, root, found, gone, func(error) {}) }()

	expect := func(ch chan string, want string) {
		t.Helper()
		select {
		case got := <-ch:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case err := <-errc:
			t.Fatalf("discover ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no report of %q within 10s", want)
		}
	}
	expect(found, "existing")
	// A launcher whose directory appears before its socket, as a real one does.
	if err := os.MkdirAll(filepath.Join(root, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	listen("new")
	expect(found, "new")
	if err := os.RemoveAll(filepath.Join(root, "existing")); err != nil {
		t.Fatal(err)
	}
	expect(gone, "existing")
}

func TestVanished(t *testing.T) {
	cases := []struct {
		name    string
		known   []string
		present []string
		want    []string
	}{
		{name: "nothing known, nothing gone", present: []string{"a"}},
		{name: "all still there", known: []string{"a", "b"}, present: []string{"b", "a", "c"}},
		{name: "removed while the watch lost events", known: []string{"c", "a", "b"}, present: []string{"b"}, want: []string{"a", "c"}},
		{name: "the directory emptied", known: []string{"a"}, want: []string{"a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			known := map[string]bool{}
			for _, k := range tc.known {
				known[k] = true
			}
			if got := vanished(known, tc.present); !slices.Equal(got, tc.want) {
				t.Errorf("vanished = %v, want %v", got, tc.want)
			}
		})
	}
}

// An inotify queue overflow (which a launcher can provoke) loses events: the watch reports the
// error, rescans, tells what it missed (a launcher gone, a new one) and keeps discovering, where
// it used to end the agent (issue 45, N7).
func TestAWatcherErrorRescansAndKeepsDiscovering(t *testing.T) {
	root := t.TempDir()
	launcher := func(uid string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, uid), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", filepath.Join(root, uid, contract.LibvirtSocket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	found, gone, rescans := make(chan string, 10), make(chan string, 10), make(chan error, 10)
	errc := make(chan error, 1)
	launcher("a")
	go func() {
		errc <- watch(ctx, w, root, map[string]bool{}, found, gone, func(err error) { rescans <- err })
	}()
	expect := func(ch chan string, want string) {
		t.Helper()
		select {
		case got := <-ch:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case err := <-errc:
			t.Fatalf("the watch ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no report of %q within 10s", want)
		}
	}
	expect(found, "a")

	// Events lost: launcher a goes and b comes while nothing watches, then the queue overflows.
	for _, dir := range []string{filepath.Join(root, "a"), root} {
		if err := w.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	launcher("b")
	w.Errors <- fsnotify.ErrEventOverflow
	select {
	case err := <-rescans:
		if !errors.Is(err, fsnotify.ErrEventOverflow) {
			t.Errorf("rescanned after %v, want the overflow", err)
		}
	case err := <-errc:
		t.Fatalf("the watch ended on the overflow: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no rescan within 10s of the overflow")
	}
	expect(found, "b")
	expect(gone, "a")
	// And it watches again: a launcher that comes now is seen.
	launcher("c")
	expect(found, "c")
}

// A launcher that churns files in its run volume while the agent is busy overflows the kernel's
// inotify queue for real: discovery rescans and goes on finding launchers (issue 45, N7).
func TestAnInotifyOverflowRescansInsteadOfEnding(t *testing.T) {
	limit, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Fatal(err)
	}
	queue, err := strconv.Atoi(strings.TrimSpace(string(limit)))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	launcher := func(uid string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, uid), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", filepath.Join(root, uid, contract.LibvirtSocket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Unbuffered, as the agent's: while nobody takes a report, discovery reads no event.
	found, gone, rescans := make(chan string), make(chan string, 10), make(chan error, 10)
	errc := make(chan error, 1)
	launcher("churner")
	go func() { errc <- discover(ctx, root, found, gone, func(err error) { rescans <- err }) }()
	// Discovery now waits to report churner; the kernel queues the churn's events meanwhile.
	dir := filepath.Join(root, "churner")
	for i := range queue {
		f := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(30 * time.Second)
	for rescanned := false; !rescanned; {
		select {
		case <-found: // churner, before the overflow and again at the rescan
		case err := <-rescans:
			if !errors.Is(err, fsnotify.ErrEventOverflow) {
				t.Errorf("rescanned after %v, want the queue's overflow", err)
			}
			rescanned = true
		case err := <-errc:
			t.Fatalf("discovery ended on the overflow: %v", err)
		case <-deadline:
			t.Fatalf("no rescan within 30s of %d events past a queue of %d", 2*queue, queue)
		}
	}
	launcher("next")
	for {
		select {
		case uid := <-found:
			if uid == "next" {
				return
			}
		case err := <-errc:
			t.Fatalf("discovery ended after the overflow: %v", err)
		case <-deadline:
			t.Fatal("a launcher that came after the overflow was not found within 30s")
		}
	}
}
