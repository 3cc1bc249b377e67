// Package cancellation cancels a VM's evacuation on request: a person (or a tool) annotates the VMI with
// lifeboat.dev/cancel-evacuation, for example after abandoning a drain and uncordoning the node.
// The controller clears the mark, deletes the evacuation's migrations that have not started moving
// memory (a running one is aborted by its source agent when it sees the mark gone, and ends Failed),
// removes the annotation and records an Event. The descheduler's in-progress annotation goes with the
// mark (evacuation/disruption).
package cancellation

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// Reasons: the Events on the VMI, and the EvictionRequested condition's reason once cancelled.
const (
	ReasonEvacuationCancelled = "EvacuationCancelled"
	// ReasonEvacuationNotCancelled: the request came when the pod was already being stopped.
	ReasonEvacuationNotCancelled = "EvacuationNotCancelled"
)

// Controller carries out cancel requests.
type Controller struct {
	lifeboat   lifeboatclient.Interface
	vmis       lifeboatlisters.VirtualMachineInstanceLister
	migrations lifeboatlisters.VirtualMachineInstanceMigrationLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	metrics    *Metrics
	log        *slog.Logger
}

// New wires the controller to its informers.
func New(lb lifeboatclient.Interface, vmis lifeboatinformers.VirtualMachineInstanceInformer, migrations lifeboatinformers.VirtualMachineInstanceMigrationInformer,
	recorder record.EventRecorder, metrics *Metrics, log *slog.Logger) *Controller {
	c := &Controller{
		lifeboat: lb, vmis: vmis.Lister(), migrations: migrations.Lister(),
		synced:   []cache.InformerSynced{vmis.Informer().HasSynced, migrations.Informer().HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "cancel"}),
		recorder: recorder, metrics: metrics, log: log.With("controller", "cancel"),
	}
	enqueue := func(obj any) {
		if v, ok := obj.(*v1alpha1.VirtualMachineInstance); ok && Requested(v) {
			c.queue.Add(v.Namespace + "/" + v.Name)
		}
	}
	_, _ = vmis.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	return c
}

// Requested reports whether the VMI carries a cancel request.
func Requested(v *v1alpha1.VirtualMachineInstance) bool {
	_, ok := v.Annotations[v1alpha1.AnnotationCancelEvacuation]
	return ok
}

// Cancellable lists the migrations a cancel deletes: the VMI's unfinished evacuation migrations
// (as the evacuation controller recorded them, whatever anyone's labels say) that have not
// started moving memory.
func Cancellable(vmi *v1alpha1.VirtualMachineInstance, migrations []*v1alpha1.VirtualMachineInstanceMigration) []*v1alpha1.VirtualMachineInstanceMigration {
	var out []*v1alpha1.VirtualMachineInstanceMigration
	for _, m := range migrations {
		if m.EvacuatedVMI() != vmi.UID ||
			m.Status.Phase == v1alpha1.MigrationRunning || m.Status.Phase.Terminal() || m.DeletionTimestamp != nil {
			continue
		}
		out = append(out, m)
	}
	return out
}

// DeleteUnstarted deletes the VMI's Cancellable migrations, so that none starts only to be
// aborted; a running one is cancelled by its source agent once the mark is gone. It returns the
// names of those it deleted.
func DeleteUnstarted(ctx context.Context, lb lifeboatclient.Interface, migrations lifeboatlisters.VirtualMachineInstanceMigrationLister,
	vmi *v1alpha1.VirtualMachineInstance) ([]string, error) {
	all, err := migrations.VirtualMachineInstanceMigrations(vmi.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var deleted []string
	for _, m := range Cancellable(vmi, all) {
		err := lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(m.Namespace).Delete(ctx, m.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &m.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("deleting migration %s: %w", m.Name, err)
		}
		deleted = append(deleted, m.Name)
	}
	return deleted, nil
}

// Run processes the queue until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	return worker.Run(ctx, "cancel", c.queue, c.synced, 1, func(ctx context.Context, key string) (time.Duration, error) {
		return 0, c.sync(ctx, key)
	}, c.log)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.vmis.VirtualMachineInstances(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !Requested(cached) {
		return nil
	}
	vmis := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	if ok, why := Decide(cached); !ok {
		if err := c.removeRequest(ctx, ns, name); err != nil {
			return err
		}
		c.metrics.Requests.WithLabelValues(OutcomeRefused).Inc()
		c.recorder.Event(cached, corev1.EventTypeWarning, ReasonEvacuationNotCancelled, "evacuation not cancelled: "+why)
		c.log.Info("evacuation not cancelled", "vmi", key, "why", why)
		return nil
	}
	var from string
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vmi, err := vmis.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		from = vmi.Status.EvacuationNodeName
		if !v1alpha1.ClearEvacuationMark(&vmi.Status, ReasonEvacuationCancelled, "the evacuation was cancelled at the request of annotation "+v1alpha1.AnnotationCancelEvacuation, metav1.Now()) {
			return nil
		}
		_, err = vmis.UpdateStatus(ctx, vmi, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("clearing the evacuation mark: %w", err)
	}
	deleted, err := DeleteUnstarted(ctx, c.lifeboat, c.migrations, cached)
	if err != nil {
		return err
	}
	if err := c.removeRequest(ctx, ns, name); err != nil {
		return err
	}
	c.metrics.Requests.WithLabelValues(OutcomeCancelled).Inc()
	msg := "evacuation cancelled on request"
	if from != "" {
		msg += ": the VM stays on node " + from
	} else {
		msg += ": it was not marked"
	}
	if len(deleted) > 0 {
		msg += fmt.Sprintf("; deleted migrations %v", deleted)
	}
	c.recorder.Event(cached, corev1.EventTypeNormal, ReasonEvacuationCancelled, msg)
	c.log.Info(msg, "vmi", key)
	return nil
}

// removeRequest removes the cancel annotation, handled either way.
func (c *Controller) removeRequest(ctx context.Context, ns, name string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, v1alpha1.AnnotationCancelEvacuation)
	_, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the cancel request: %w", err)
	}
	return nil
}
