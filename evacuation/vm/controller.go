package vm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
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

// Event reasons on a VirtualMachine.
const (
	ReasonSuccessfulCreate = "SuccessfulCreate"
	ReasonFailedCreate     = "FailedCreate"
	ReasonRestarting       = "Restarting"
	ReasonStopping         = "Stopping"
	ReasonInstanceNotOwned = "InstanceNotOwned"
)

// FinalizerInstance holds a deleted VM until its instance is gone: its guest shuts down as a
// deleted VMI's does (ACPI, then its grace period), and the VM reads Stopping meanwhile.
const FinalizerInstance = v1alpha1.GroupName + "/vm-instance"

// Controller runs VirtualMachines' instances by their run strategies.
type Controller struct {
	lifeboat lifeboatclient.Interface
	vms      lifeboatlisters.VirtualMachineLister
	vmis     lifeboatlisters.VirtualMachineInstanceLister
	pods     corelisters.PodLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	restarts *prometheus.CounterVec
	now      func() metav1.Time
	log      *slog.Logger
}

// New wires the controller to its informers; the pod informer holds launcher pods.
func New(lb lifeboatclient.Interface, vmInformer lifeboatinformers.VirtualMachineInformer, vmiInformer lifeboatinformers.VirtualMachineInstanceInformer,
	podInformer coreinformers.PodInformer, recorder record.EventRecorder, reg prometheus.Registerer, log *slog.Logger) *Controller {
	c := &Controller{
		lifeboat: lb, vms: vmInformer.Lister(), vmis: vmiInformer.Lister(), pods: podInformer.Lister(),
		synced: []cache.InformerSynced{vmInformer.Informer().HasSynced, vmiInformer.Informer().HasSynced, podInformer.Informer().HasSynced},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "vm"}),
		recorder: recorder,
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_vm_restarts_total",
			Help: "Instances of VirtualMachines made again after one ended, by run strategy and by cause (the ended instance's phase and reason).",
		}, []string{"run_strategy", "cause"}),
		now: metav1.Now,
		log: log.With("controller", "vm"),
	}
	reg.MustRegister(c.restarts)
	_, _ = vmInformer.Informer().AddEventHandler(worker.Handler(c.enqueue))
	// An instance is named after its VM: its key is the VM's.
	_, _ = vmiInformer.Informer().AddEventHandler(worker.Handler(c.enqueue))
	_, _ = podInformer.Informer().AddEventHandler(worker.Handler(func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok && pod.Labels[v1alpha1.LabelVMIName] != "" {
			c.queue.Add(pod.Namespace + "/" + pod.Labels[v1alpha1.LabelVMIName])
		}
	}))
	return c
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// Run processes the queue with the given number of workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return worker.Run(ctx, "vm", c.queue, c.synced, workers, func(ctx context.Context, key string) (time.Duration, error) {
		return 0, c.sync(ctx, key)
	}, c.log)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	cached, err := c.vms.VirtualMachines(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	vm := cached.DeepCopy()
	vmi, err := c.vmis.VirtualMachineInstances(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		vmi = nil
	} else if err != nil {
		return err
	}
	if vmi != nil && !metav1.IsControlledBy(vmi, vm) {
		// A VMI of the VM's name that the VM did not make: never touch another's instance.
		c.recorder.Eventf(vm, corev1.EventTypeWarning, ReasonInstanceNotOwned, "VMI %s/%s exists and is not this VM's: the VM cannot run until it is gone", namespace, name)
		return c.writeStatus(ctx, vm, nil)
	}
	if vm.DeletionTimestamp != nil {
		return c.syncDeleted(ctx, vm, vmi)
	}
	if !slices.Contains(vm.Finalizers, FinalizerInstance) {
		vm.Finalizers = append(vm.Finalizers, FinalizerInstance)
		if vm, err = c.lifeboat.LifeboatV1alpha1().VirtualMachines(namespace).Update(ctx, vm, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adding the finalizer: %w", err)
		}
	}
	switch action := Decide(vm, vmi); action {
	case Create:
		created, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(namespace).Create(ctx, NewInstance(vm), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // our cache is behind; the instance's event brings the VM back
		}
		if err != nil {
			c.recorder.Eventf(vm, corev1.EventTypeWarning, ReasonFailedCreate, "creating the instance: %v", err)
			return err
		}
		vmi = created
		c.recorder.Eventf(vm, corev1.EventTypeNormal, ReasonSuccessfulCreate, "created instance %s", created.Name)
	case Restart, Stop, Clean:
		if err := c.deleteInstance(ctx, vmi); err != nil {
			return err
		}
		if action == Restart {
			cause := Cause(vmi)
			c.restarts.WithLabelValues(string(runStrategy(vm)), cause).Inc()
			c.recorder.Eventf(vm, corev1.EventTypeNormal, ReasonRestarting, "instance %s ended (%s: %s); run strategy %s starts it again",
				vmi.Name, cause, vmi.Status.Message, runStrategy(vm))
		} else if action == Stop {
			c.recorder.Eventf(vm, corev1.EventTypeNormal, ReasonStopping, "run strategy Halted: stopping instance %s (its guest shuts down gracefully)", vmi.Name)
		}
		vmi = vmi.DeepCopy()
		vmi.DeletionTimestamp = ptrTime(c.now())
		if action == Restart {
			return c.writeRestart(ctx, vm, vmi)
		}
	}
	return c.writeStatus(ctx, vm, vmi)
}

// writeRestart writes the status of vm with one restart more, the one just made. The ended
// instance is deleted already, so a sync retried after a lost write would find nothing left to
// count: on a conflict (a cache behind the API server) the restart is added to the VM as the API
// server has it.
func (c *Controller) writeRestart(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if vm == nil {
			fresh, err := c.lifeboat.LifeboatV1alpha1().VirtualMachines(vmi.Namespace).Get(ctx, vmi.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			vm = fresh
		}
		vm.Status.Restarts++
		err := c.writeStatus(ctx, vm, vmi)
		vm = nil
		return err
	})
}

// syncDeleted stops the deleted VM's instance and lets the VM go once the instance is gone.
func (c *Controller) syncDeleted(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) error {
	if vmi != nil {
		if vmi.DeletionTimestamp == nil {
			if err := c.deleteInstance(ctx, vmi); err != nil {
				return err
			}
		}
		return nil // the instance's deletion brings the VM back
	}
	i := slices.Index(vm.Finalizers, FinalizerInstance)
	if i < 0 {
		return nil
	}
	vm.Finalizers = slices.Delete(vm.Finalizers, i, i+1)
	_, err := c.lifeboat.LifeboatV1alpha1().VirtualMachines(vm.Namespace).Update(ctx, vm, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// deleteInstance deletes exactly the instance seen, never a newer one of the same name.
func (c *Controller) deleteInstance(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Delete(ctx, vmi.Name,
		metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(vmi.UID))})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func (c *Controller) writeStatus(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) error {
	status := Status(vm, vmi, c.unschedulable(vmi), c.now())
	if apiequality.Semantic.DeepEqual(status, vm.Status) {
		return nil
	}
	vm.Status = status
	_, err := c.lifeboat.LifeboatV1alpha1().VirtualMachines(vm.Namespace).UpdateStatus(ctx, vm, metav1.UpdateOptions{})
	return err
}

// unschedulable says whether the scheduler found no node for the instance's launcher pod.
func (c *Controller) unschedulable(vmi *v1alpha1.VirtualMachineInstance) bool {
	if vmi == nil {
		return false
	}
	pods, err := c.pods.Pods(vmi.Namespace).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelVMIUID: string(vmi.UID)}))
	if err != nil {
		return false
	}
	for _, p := range pods {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
	}
	return false
}

// NewInstance is the VM's instance: its template, named after the VM and controlled by it.
func NewInstance(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachineInstance {
	t := vm.Spec.Template.DeepCopy()
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name: vm.Name, Namespace: vm.Namespace, Labels: t.ObjectMeta.Labels, Annotations: t.ObjectMeta.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vm, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachine"))},
		},
		Spec: t.Spec,
	}
}

// Cause is why an instance ended, for Events and the restart metric: its phase and reason.
func Cause(vmi *v1alpha1.VirtualMachineInstance) string {
	if vmi.Status.Reason == "" {
		return string(vmi.Status.Phase)
	}
	return string(vmi.Status.Phase) + "/" + vmi.Status.Reason
}

func runStrategy(vm *v1alpha1.VirtualMachine) v1alpha1.RunStrategy {
	if vm.Spec.RunStrategy == "" {
		return v1alpha1.RunStrategyAlways
	}
	return vm.Spec.RunStrategy
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }
