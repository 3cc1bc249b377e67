package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	go func() { errc <- discover(ctx, root, found, gone) }()

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
