package worker

import (
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Handler calls f for each added, updated (the new object) and deleted object of an informer.
func Handler(f func(obj any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, obj any) { f(obj) }, DeleteFunc: f}
}

// Enqueue adds the namespace/name key of obj, or of the object a deletion tombstone holds.
func Enqueue(queue workqueue.TypedInterface[string], obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	queue.Add(key)
}
