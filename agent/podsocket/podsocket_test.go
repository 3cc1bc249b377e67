package podsocket

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestListenOpensTheSocketToThePodAndReplacesOnlyASocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "notify.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o666 {
		t.Errorf("socket mode = %s, want rw for everyone (the launcher's user is not root)", fi.Mode())
	}
	ln.Close()
	// A socket left behind (a crashed agent's) is replaced.
	if _, err := net.Listen("unix", path); err != nil {
		t.Fatal(err)
	}
	if ln, err := Listen(path); err != nil {
		t.Errorf("Listen over a stale socket: %v", err)
	} else {
		ln.Close()
	}
	// A launcher's own file, or its symlink to a node file, is neither replaced nor chmodded.
	target := filepath.Join(dir, "node-file")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, "planted.sock")
	if err := os.Symlink(target, planted); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{target, planted} {
		if _, err := Listen(p); err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Errorf("Listen(%s) = %v, want a refusal: it is not a socket", filepath.Base(p), err)
		}
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o600 {
		t.Errorf("the symlink's target changed mode to %s", fi.Mode())
	}
}

func TestDialRefusesASymlinkToAnotherSocket(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other-vm-libvirt-sock")
	ln, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	link := filepath.Join(dir, "libvirt-sock")
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	if c, err := Dial(context.Background(), link); err == nil {
		c.Close()
		t.Fatal("Dial followed a symlink a launcher could plant to another VM's socket")
	}
	c, err := Dial(context.Background(), other)
	if err != nil {
		t.Fatalf("Dial of the socket itself: %v", err)
	}
	c.Close()
}

// A socket bound but not yet listening (a daemon starting) refuses connections: AwaitListening
// waits for it to listen, and gives up with the refusal if it never does within its bound.
func TestAwaitListeningWaitsForABoundSocketToListen(t *testing.T) {
	bound := func(t *testing.T) (fd int, path string) {
		t.Helper()
		path = filepath.Join(t.TempDir(), "libvirt-sock")
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatal(err)
		}
		return fd, path
	}

	fd, path := bound(t)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The daemon's start, between its bind and its listen: it listens 50 ms after the wait began.
	time.AfterFunc(50*time.Millisecond, func() { _ = unix.Listen(fd, 8) })
	if err := s.AwaitListening(context.Background(), 5*time.Second); err != nil {
		t.Errorf("a socket that listens 50 ms after it was bound: %v; want it reached", err)
	}

	_, never := bound(t)
	s2, err := Open(never)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	start := time.Now()
	err = s2.AwaitListening(context.Background(), 100*time.Millisecond)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a socket that never listens: %v; want the refusal", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a socket that never listens held the wait %s, want about its bound of 100ms", took)
	}
}
