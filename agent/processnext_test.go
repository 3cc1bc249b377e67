package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// A sync that waits for something still to come (a target launcher starting) is tried again as
// a failed one is, but its log line is a wait at Info: an operator reading the agent's errors sees
// failures only. A failure stays an Error; success is forgotten.
func TestProcessNextTellsAWaitFromAFailure(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		retried   bool
		wantLevel string
		wantMsg   string
	}{
		{"a wait", notYet("the target launcher of vm to connect"), true, "INFO", "waiting, will look again"},
		{"a wrapped wait", errors.Join(notYet("the target launcher of vm to connect")), true, "INFO", "waiting, will look again"},
		{"a failure", errors.New("announcing the target proxies: the server is gone"), true, "ERROR", "sync failed, will retry"},
		{"success", nil, false, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, time.Millisecond))
			defer queue.ShutDown()
			var out bytes.Buffer
			log := slog.New(slog.NewTextHandler(&out, nil))
			queue.Add("ns/mig")
			if !processNext(context.Background(), queue, func(context.Context, string) (time.Duration, error) { return 0, tc.err }, log) {
				t.Fatal("processNext ended with the queue still running")
			}
			if got := queue.NumRequeues("ns/mig"); (got > 0) != tc.retried {
				t.Errorf("requeues of the key = %d, want retried %v", got, tc.retried)
			}
			line := out.String()
			if tc.wantLevel == "" {
				if line != "" {
					t.Errorf("a successful sync logged %q", line)
				}
				return
			}
			if !strings.Contains(line, "level="+tc.wantLevel) || !strings.Contains(line, tc.wantMsg) || !strings.Contains(line, tc.err.Error()) {
				t.Errorf("log line %q, want level %s, %q and the reason %q", line, tc.wantLevel, tc.wantMsg, tc.err)
			}
		})
	}
}
