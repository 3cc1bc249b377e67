package guest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// consolePoll is how often WaitForConsole reads the console log.
const consolePoll = 100 * time.Millisecond

// WaitForConsole polls the guest's console log at path until done returns true for its
// contents, and returns them. It gives up when ctx ends, with an error that says what was
// expected (want) and shows the end of the console.
func WaitForConsole(ctx context.Context, path, want string, done func(console string) bool) (string, error) {
	ticker := time.NewTicker(consolePoll)
	defer ticker.Stop()
	for {
		b, err := os.ReadFile(path)
		console := strings.ReplaceAll(string(b), "\r\n", "\n")
		if err == nil && done(console) {
			return console, nil
		}
		select {
		case <-ctx.Done():
			return console, fmt.Errorf("waiting for %s on the guest console %s: %w; its last lines:\n%s", want, path, ctx.Err(), tail(console, 20))
		case <-ticker.C:
		}
	}
}

// WaitForLine waits until the console log at path has a line equal to line.
func WaitForLine(ctx context.Context, path, line string) (string, error) {
	return WaitForConsole(ctx, path, fmt.Sprintf("the line %q", line), func(console string) bool {
		return HasLine(console, line)
	})
}

// HasLine reports whether console has a line equal to line.
func HasLine(console, line string) bool {
	for _, l := range strings.Split(console, "\n") {
		if strings.TrimRight(l, "\r") == line {
			return true
		}
	}
	return false
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Counter is the guest's latest counter on its console, 0 before the first.
func Counter(console string) int {
	n, _ := protocol.LastCounter(console)
	return n
}
