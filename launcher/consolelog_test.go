package launcher

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// A console log past its bound is emptied, and the guest's next output lands right after the
// note saying so, with no hole where the old output was (QEMU appends, as the domain asks);
// one within its bound, or not there yet, is left alone.
func TestAFloodedConsoleLogIsEmptiedAndStaysSmall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	if emptied, err := trimConsoleLog(path, 1024); emptied || err != nil {
		t.Fatalf("a log not there yet: emptied %v, %v; want it left alone", emptied, err)
	}
	qemu, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer qemu.Close()
	if _, err := qemu.Write(bytes.Repeat([]byte("x"), 1024)); err != nil {
		t.Fatal(err)
	}
	if emptied, err := trimConsoleLog(path, 1024); emptied || err != nil {
		t.Fatalf("a log at its bound: emptied %v, %v; want it left alone", emptied, err)
	}
	if _, err := qemu.Write(bytes.Repeat([]byte("y"), 4096)); err != nil {
		t.Fatal(err)
	}
	if emptied, err := trimConsoleLog(path, 1024); !emptied || err != nil {
		t.Fatalf("a log past its bound: emptied %v, %v; want it emptied", emptied, err)
	}
	if _, err := qemu.Write([]byte("login: ")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := consoleLogEmptied + "login: "; string(got) != want {
		t.Errorf("the log after it was emptied holds %q, want %q", got, want)
	}
}
