package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

func TestRunRetriesFailuresAndHonoursRequeueAfter(t *testing.T) {
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, 10*time.Millisecond))
	var mu sync.Mutex
	calls := map[string]int{}
	done := make(chan struct{})
	sync := func(_ context.Context, key string) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[key]++
		switch {
		case key == "flaky" && calls[key] < 3:
			return 0, errors.New("not yet")
		case key == "later" && calls[key] == 1:
			return 20 * time.Millisecond, nil
		}
		if calls["flaky"] == 3 && calls["later"] == 2 {
			close(done)
		}
		return 0, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queue.Add("flaky")
	queue.Add("later")
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, "test", queue, []cache.InformerSynced{func() bool { return true }}, 2, sync, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("want flaky synced 3 times (two failures retried) and later twice (requeued), got %v", calls)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
