package guest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHasLine(t *testing.T) {
	console := "booting\r\nlifeboat-guest ready\r\nlifeboat-guest counter 1\n"
	tests := []struct {
		line string
		want bool
	}{
		{"lifeboat-guest ready", true},
		{"lifeboat-guest counter 1", true},
		{"lifeboat-guest", false},
		{"ready", false},
	}
	for _, tt := range tests {
		if got := HasLine(console, tt.line); got != tt.want {
			t.Errorf("HasLine(%q) = %v, want %v", tt.line, got, tt.want)
		}
	}
}

func TestWaitForLineSaysWhatItWaitedFor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(path, []byte("booting\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := WaitForLine(ctx, path, "lifeboat-guest ready")
	if err == nil || !strings.Contains(err.Error(), `"lifeboat-guest ready"`) || !strings.Contains(err.Error(), "booting") {
		t.Fatalf("WaitForLine() error = %v, want one naming the line and showing the console", err)
	}

	// The line arrives while WaitForLine is already waiting (it just timed out without it).
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found := make(chan error, 1)
	go func() {
		_, err := WaitForLine(ctx, path, "lifeboat-guest ready")
		found <- err
	}()
	if err := os.WriteFile(path, []byte("booting\r\nlifeboat-guest ready\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-found; err != nil {
		t.Fatal(err)
	}
}
