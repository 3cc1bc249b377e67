package launcher

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// guestConsole plays QEMU's end of the console socket in dir: it answers every line with
// "heard <line>" and reports what it read when its client leaves.
func guestConsole(t *testing.T, dir string) <-chan string {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, contract.ConsoleSocket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	read := make(chan string, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		var all strings.Builder
		r := bufio.NewReader(io.TeeReader(conn, &all))
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				read <- all.String()
				return
			}
			_, _ = io.WriteString(conn, "heard "+line)
		}
	}()
	return read
}

// lockedWriter lets the test read what Console wrote while it still writes.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestConsoleRelaysUntilTheEscapeAndAdmitsOneSessionAtATime(t *testing.T) {
	dir := t.TempDir()
	read := guestConsole(t, dir)
	in, typing, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out := &lockedWriter{}
	ended := make(chan error, 1)
	go func() { ended <- Console(dir, in, out) }()

	if _, err := io.WriteString(typing, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(out.String(), "heard hello\n"), nil
	}); err != nil {
		t.Fatalf("the guest's answer did not come back within 10s: got %q", out.String())
	}

	second, _, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if err := Console(dir, second, io.Discard); !errors.Is(err, ErrConsoleBusy) {
		t.Errorf("a second session while the first is open: %v, want %v", err, ErrConsoleBusy)
	}

	// Ctrl+] ends the session; what follows it on the line never reaches the guest.
	if _, err := typing.Write([]byte("bye\n\x1dnot sent\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the session ended with %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ctrl+] did not end the session within 10s")
	}
	if got := <-read; got != "hello\nbye\n" {
		t.Errorf("the guest read %q, want %q", got, "hello\nbye\n")
	}
}

func TestConsoleWithoutAGuestSaysSo(t *testing.T) {
	in, _, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	err = Console(t.TempDir(), in, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "the guest's serial console is not open in this pod") {
		t.Errorf("Console with no guest: %v, want an error saying the console is not open", err)
	}
}
