package disruption

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	coreinformers "k8s.io/client-go/informers/core/v1"
	policyinformers "k8s.io/client-go/informers/policy/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// Event reasons on VMIs.
const (
	ReasonBudgetCreated = "DisruptionBudgetCreated"
	ReasonBudgetChanged = "DisruptionBudgetChanged"
	ReasonBudgetDeleted = "DisruptionBudgetDeleted"
	ReasonBudgetFailed  = "FailedDisruptionBudget"
)

// Controller keeps each VMI's disruption budget and the descheduler annotation on its pods.
type Controller struct {
	kube       kubernetes.Interface
	vmis       lifeboatlisters.VirtualMachineInstanceLister
	migrations lifeboatlisters.VirtualMachineInstanceMigrationLister
	configs    lifeboatlisters.LifeboatConfigLister
	pods       corelisters.PodLister
	budgets    policylisters.PodDisruptionBudgetLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	log        *slog.Logger
}

// NewBudgetInformer watches the budgets lifeboat makes (those labelled with a VMI's UID); the
// disruption controller writes them and the migration controller waits on them.
func NewBudgetInformer(kube kubernetes.Interface) cache.SharedIndexInformer {
	return policyinformers.NewFilteredPodDisruptionBudgetInformer(kube, metav1.NamespaceAll, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelVMIUID })
}

// New wires the controller. The pod informer should hold launcher pods, the budget informer be
// NewBudgetInformer's; whoever calls New runs the budget informer.
func New(kube kubernetes.Interface, vmis lifeboatinformers.VirtualMachineInstanceInformer, migrations lifeboatinformers.VirtualMachineInstanceMigrationInformer,
	configs lifeboatinformers.LifeboatConfigInformer, pods coreinformers.PodInformer, budgets cache.SharedIndexInformer,
	recorder record.EventRecorder, log *slog.Logger) *Controller {
	c := &Controller{
		kube: kube, vmis: vmis.Lister(), migrations: migrations.Lister(), configs: configs.Lister(), pods: pods.Lister(),
		budgets: policylisters.NewPodDisruptionBudgetLister(budgets.GetIndexer()),
		synced: []cache.InformerSynced{vmis.Informer().HasSynced, migrations.Informer().HasSynced, configs.Informer().HasSynced,
			pods.Informer().HasSynced, budgets.HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "disruption"}),
		recorder: recorder, log: log.With("controller", "disruption"),
	}
	_, _ = vmis.Informer().AddEventHandler(worker.Handler(c.enqueue))
	byVMI := cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueVMIOf,
		UpdateFunc: func(_, obj any) { c.enqueueVMIOf(obj) },
		DeleteFunc: c.enqueueVMIOf,
	}
	_, _ = pods.Informer().AddEventHandler(byVMI)
	_, _ = budgets.AddEventHandler(byVMI)
	// A new migration grows the budget before its target pod exists; its end shrinks it.
	_, _ = migrations.Informer().AddEventHandler(worker.Handler(func(obj any) {
		if m, ok := obj.(*v1alpha1.VirtualMachineInstanceMigration); ok {
			c.queue.Add(m.Namespace + "/" + m.Spec.VMIName)
		}
	}))
	// The cluster's default strategy may change every VMI's budget.
	_, _ = configs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.enqueueAll() },
		UpdateFunc: func(_, _ any) { c.enqueueAll() },
		DeleteFunc: func(any) { c.enqueueAll() },
	})
	return c
}

func (c *Controller) enqueue(obj any) { worker.Enqueue(c.queue, obj) }

// enqueueVMIOf maps a launcher pod or a budget to its VMI through the VMI-name label both carry.
func (c *Controller) enqueueVMIOf(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if o, ok := obj.(metav1.Object); ok && o.GetLabels()[v1alpha1.LabelVMIName] != "" {
		c.queue.Add(o.GetNamespace() + "/" + o.GetLabels()[v1alpha1.LabelVMIName])
	}
}

func (c *Controller) enqueueAll() {
	vmis, _ := c.vmis.List(labels.Everything())
	for _, v := range vmis {
		c.queue.Add(v.Namespace + "/" + v.Name)
	}
}

// Run runs the budget informer and the workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return worker.Run(ctx, "disruption", c.queue, c.synced, workers, func(ctx context.Context, key string) (time.Duration, error) {
		return 0, c.sync(ctx, key)
	}, c.log)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	vmi, err := c.vmis.VirtualMachineInstances(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil // its budget goes with it (owner reference)
	}
	if err != nil {
		return err
	}
	config := c.config()
	pods, err := c.pods.Pods(ns).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelVMIUID: string(vmi.UID)}))
	if err != nil {
		return err
	}
	// The annotation does not wait for the budget: each is retried on its own failure.
	migrating, err := hasUnfinishedMigration(c.migrations, vmi)
	if err != nil {
		return err
	}
	errs := []error{c.syncBudget(ctx, vmi, MinAvailable(vmi, config, pods, migrating))}
	for _, p := range pods {
		errs = append(errs, c.syncAnnotation(ctx, p, EvictionInProgress(vmi, p)))
	}
	return errors.Join(errs...)
}

// syncBudget creates, resizes or deletes the VMI's budget to keep want pods (0: no budget).
func (c *Controller) syncBudget(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, want int32) error {
	budgets := c.kube.PolicyV1().PodDisruptionBudgets(vmi.Namespace)
	existing, err := c.budgets.PodDisruptionBudgets(vmi.Namespace).Get(BudgetName(vmi))
	if apierrors.IsNotFound(err) {
		existing = nil
	} else if err != nil {
		return err
	}
	if existing != nil && !metav1.IsControlledBy(existing, vmi) {
		c.recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonBudgetFailed, "PodDisruptionBudget %s exists and is not this VMI's; lifeboat leaves it alone", existing.Name)
		return nil
	}
	switch {
	case want == 0 && existing != nil:
		err := budgets.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &existing.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting PodDisruptionBudget %s: %w", existing.Name, err)
		}
		c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonBudgetDeleted, "deleted PodDisruptionBudget %s: the VM's eviction strategy %s does not protect it now",
			existing.Name, v1alpha1.EffectiveEvictionStrategy(vmi, c.config()))
	case want > 0 && existing == nil:
		if _, err := budgets.Create(ctx, NewBudget(vmi, want), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			c.recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonBudgetFailed, "creating its PodDisruptionBudget: %v", err)
			return fmt.Errorf("creating PodDisruptionBudget %s: %w", BudgetName(vmi), err)
		}
		c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonBudgetCreated, "created PodDisruptionBudget %s (minAvailable %d)", BudgetName(vmi), want)
	case want > 0 && existing.Spec.MinAvailable.IntValue() != int(want):
		// A patch, not an update: the disruption controller keeps writing the budget's status,
		// and an update from a stale copy would conflict with it.
		patch := fmt.Sprintf(`{"spec":{"minAvailable":%d}}`, want)
		b, err := budgets.Patch(ctx, existing.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("resizing PodDisruptionBudget %s: %w", existing.Name, err)
		}
		why := "a migration's target pod is protected too, from before it exists"
		if want == 1 {
			why = "the VM has one pod again"
		}
		c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonBudgetChanged, "PodDisruptionBudget %s now keeps %d pods: %s", b.Name, want, why)
	}
	return nil
}

// config is the cluster's LifeboatConfig, nil if there is none.
func (c *Controller) config() *v1alpha1.LifeboatConfig {
	cfg, err := c.configs.Get(v1alpha1.ConfigName)
	if err != nil {
		return nil
	}
	return cfg
}

// syncAnnotation sets or removes the descheduler's eviction-in-progress annotation on a pod.
func (c *Controller) syncAnnotation(ctx context.Context, pod *corev1.Pod, want bool) error {
	_, has := pod.Annotations[v1alpha1.AnnotationEvictionInProgress]
	if has == want {
		return nil
	}
	var value any // nil removes it in a merge patch
	if want {
		value = ""
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.AnnotationEvictionInProgress: value}}})
	if err != nil {
		return err
	}
	_, err = c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("annotating pod %s: %w", pod.Name, err)
	}
	c.log.Info("descheduler annotation", "pod", pod.Namespace+"/"+pod.Name, "annotation", v1alpha1.AnnotationEvictionInProgress, "set", want)
	return nil
}

// hasUnfinishedMigration reports whether the VMI has a migration that has not ended.
func hasUnfinishedMigration(migrations lifeboatlisters.VirtualMachineInstanceMigrationLister, vmi *v1alpha1.VirtualMachineInstance) (bool, error) {
	ms, err := migrations.VirtualMachineInstanceMigrations(vmi.Namespace).List(labels.Everything())
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.Spec.VMIName == vmi.Name && !m.Status.Phase.Terminal() && m.DeletionTimestamp == nil {
			return true, nil
		}
	}
	return false, nil
}

// BudgetName is the name of a VMI's budget.
func BudgetName(vmi *v1alpha1.VirtualMachineInstance) string {
	const prefix, maxLen = "lifeboat-", 253
	name := vmi.Name
	if len(prefix)+len(name) > maxLen {
		// Two VMIs differing only past the cut would collide; the UID keeps them apart.
		name = name[:maxLen-len(prefix)-9] + "-" + string(vmi.UID)[:8]
	}
	return prefix + name
}

// NewBudget is the VMI's budget: its launcher pods, of which want must stay available.
func NewBudget(vmi *v1alpha1.VirtualMachineInstance, want int32) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{
			Name: BudgetName(vmi), Namespace: vmi.Namespace,
			Labels:          map[string]string{v1alpha1.LabelVMIName: vmi.Name, v1alpha1.LabelVMIUID: string(vmi.UID)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))},
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrInt(want),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelVMIUID: string(vmi.UID)}},
		},
	}
}

func ptrInt(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
