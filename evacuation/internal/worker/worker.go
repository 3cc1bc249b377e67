// Package worker runs a controller's workqueue the sample-controller way: wait for the caches,
// then workers take keys and call the controller's sync. Whether a key is retried is decided
// here and nowhere else.
package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Sync handles one key. An error retries the key with the queue's rate limit; a positive
// requeueAfter, without error, asks to look again then (a deliberate wait).
type Sync func(ctx context.Context, key string) (requeueAfter time.Duration, err error)

// Run waits for the caches, then runs workers on the queue until ctx ends.
func Run(ctx context.Context, name string, queue workqueue.TypedRateLimitingInterface[string], synced []cache.InformerSynced,
	workers int, sync Sync, log *slog.Logger) error {
	defer utilruntime.HandleCrash()
	defer queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("%s controller: caches did not sync", name)
	}
	log.Info("started", "workers", workers)
	for range workers {
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			for processNext(ctx, queue, sync, log) {
			}
		}, time.Second)
	}
	<-ctx.Done()
	return nil
}

func processNext(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], sync Sync, log *slog.Logger) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)
	requeueAfter, err := sync(ctx, key)
	switch {
	case err != nil:
		log.Error("sync failed, will retry", "key", key, "err", err)
		queue.AddRateLimited(key)
	case requeueAfter > 0:
		queue.Forget(key)
		queue.AddAfter(key, requeueAfter)
	default:
		queue.Forget(key)
	}
	return true
}
