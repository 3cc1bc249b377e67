package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// podWorkers is how many pods the node syncs at once.
const podWorkers = 4

// podController runs the pods bound to one node and reports their status: the kubelet's pod
// workers and status manager, in the shape of sample-controller.
type podController struct {
	client   kubernetes.Interface
	nodeName string
	address  string
	recorder record.EventRecorder
	runtime  *podRuntime

	informers  informers.SharedInformerFactory
	pods       corelisters.PodLister
	podsSynced cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	workers    sync.WaitGroup
	// freezer holds the workers while the node is frozen.
	freezer *freezer
}

func newPodController(client kubernetes.Interface, cfg Config, l layout, recorder record.EventRecorder, network *nodeNetwork, cpuGroup string) (*podController, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.Name).String()
		}))
	podInformer := factory.Core().V1().Pods()
	c := &podController{
		client:     client,
		nodeName:   cfg.Name,
		address:    cfg.Address,
		recorder:   recorder,
		informers:  factory,
		pods:       podInformer.Lister(),
		podsSynced: podInformer.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods-" + cfg.Name},
		),
	}
	c.runtime = &podRuntime{
		nodeName: cfg.Name,
		layout:   l,
		binaries: cfg.Binaries,
		address:  cfg.Address,
		network:  network,
		devices:  cfg.Devices,
		cpuGroup: cpuGroup,
		recorder: recorder,
		logger:   cfg.Logger,
		changed:  c.queue.Add,
		records:  map[string]*podRecord{},
		live:     map[*process]struct{}{},
	}
	_, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
		DeleteFunc: c.enqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("watching the pods of node %s: %w", cfg.Name, err)
	}
	return c, nil
}

func (c *podController) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// start fills the pod cache, waiting no longer than startCtx allows, and starts the workers,
// which run until runCtx ends and stop is called.
func (c *podController) start(startCtx, runCtx context.Context) error {
	c.informers.Start(runCtx.Done())
	if !cache.WaitForNamedCacheSyncWithContext(startCtx, c.podsSynced) {
		return fmt.Errorf("filling the pod cache of node %s: %w", c.nodeName, context.Cause(startCtx))
	}
	for range podWorkers {
		c.workers.Go(func() {
			for c.processNextWorkItem(runCtx) {
			}
		})
	}
	return nil
}

// stop ends the workers after their current pod and then the informers.
func (c *podController) stop() {
	c.queue.ShutDown()
	c.workers.Wait()
	c.informers.Shutdown()
}

// requeueAfter is a deliberate wait (a restart back-off), not a failure to retry.
type requeueAfter time.Duration

func (r requeueAfter) Error() string { return fmt.Sprintf("look again in %s", time.Duration(r)) }

// processNextWorkItem is the only place that decides about retries.
func (c *podController) processNextWorkItem(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)

	if c.freezer != nil {
		c.freezer.waitThawed(ctx)
	}
	err := c.syncPod(ctx, key)
	var wait requeueAfter
	switch {
	case err == nil:
		c.queue.Forget(key)
	case ctx.Err() != nil:
		// The node is stopping; what was cut short no longer matters.
		c.queue.Forget(key)
	case errors.As(err, &wait):
		c.queue.Forget(key)
		c.queue.AddAfter(key, time.Duration(wait))
	case apierrors.IsConflict(err):
		// The cache was behind our own last write; the update on its way enqueues the pod again.
		klog.FromContext(ctx).V(4).Info("Pod changed while syncing, retrying", "pod", key)
		c.queue.AddRateLimited(key)
	default:
		utilruntime.HandleErrorWithContext(ctx, err, "Syncing pod", "pod", key)
		c.queue.AddRateLimited(key)
	}
	return true
}
