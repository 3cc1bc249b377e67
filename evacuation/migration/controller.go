package migration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
	"github.com/lifeboat-vm/lifeboat/evacuation/placement"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// FinalizerCleanup keeps a deleted migration until its target pod is gone.
const FinalizerCleanup = "lifeboat.dev/migration-cleanup"

// Controller reconciles VirtualMachineInstanceMigrations with their target pods.
type Controller struct {
	kube       kubernetes.Interface
	lifeboat   lifeboatclient.Interface
	migrations lifeboatlisters.VirtualMachineInstanceMigrationLister
	vmis       lifeboatlisters.VirtualMachineInstanceLister
	configs    lifeboatlisters.LifeboatConfigLister
	pods       corelisters.PodLister
	budgets    policylisters.PodDisruptionBudgetLister
	nodes      corelisters.NodeLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	opts       vmi.PodOptions
	log        *slog.Logger
	refused    *prometheus.CounterVec
	late       prometheus.Counter
	leases     coordinationlisters.LeaseNamespaceLister
}

// New wires the controller to its informers; the pod informer should hold launcher pods, the
// node informer the cluster's nodes (read for the devices they offer target pods), the lease
// informer be NewLeaseInformer's; whoever calls New runs the budget, node and lease informers.
func New(kube kubernetes.Interface, lb lifeboatclient.Interface, migrations lifeboatinformers.VirtualMachineInstanceMigrationInformer,
	vmis lifeboatinformers.VirtualMachineInstanceInformer, configs lifeboatinformers.LifeboatConfigInformer, pods coreinformers.PodInformer,
	budgets, nodes, leases cache.SharedIndexInformer, recorder record.EventRecorder, opts vmi.PodOptions, reg prometheus.Registerer, log *slog.Logger) *Controller {
	c := &Controller{
		kube: kube, lifeboat: lb, migrations: migrations.Lister(), vmis: vmis.Lister(), configs: configs.Lister(), pods: pods.Lister(),
		budgets: policylisters.NewPodDisruptionBudgetLister(budgets.GetIndexer()),
		nodes:   corelisters.NewNodeLister(nodes.GetIndexer()),
		synced: []cache.InformerSynced{migrations.Informer().HasSynced, vmis.Informer().HasSynced, configs.Informer().HasSynced,
			pods.Informer().HasSynced, budgets.HasSynced, nodes.HasSynced, leases.HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "migration"}),
		recorder: recorder, opts: opts, log: log.With("controller", "migration"),
		leases: coordinationlisters.NewLeaseLister(leases.GetIndexer()).Leases(corev1.NamespaceNodeLease),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_migrations_refused_total",
			Help: "Migrations failed before their target pod was made, by refusal: Concurrent (their VMI already had one under way), ManualLimit (as many Manual migrations as spec.migrations.parallelManualMigrationsPerCluster allows were under way).",
		}, []string{"refusal"}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_migration_targets_not_ready_in_time_total",
			Help: "Migration targets given up on because they were not ready by their share of the evacuation deadline (half the time it leaves besides moving the guest); the VM's next target avoids their node for a while.",
		}),
	}
	reg.MustRegister(c.refused, c.late, noTargetCollector{vmis: vmis.Lister()})
	registerMetrics(reg, migrations.Informer())
	_, _ = migrations.Informer().AddEventHandler(worker.Handler(c.enqueue))
	// A VMI's or a pod's change concerns the migrations of that VMI.
	byVMI := cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueForVMI,
		UpdateFunc: func(_, obj any) { c.enqueueForVMI(obj) },
		DeleteFunc: c.enqueueForVMI,
	}
	_, _ = vmis.Informer().AddEventHandler(byVMI)
	_, _ = pods.Informer().AddEventHandler(byVMI)
	// A target pod waits for its VMI's budget to cover it.
	_, _ = budgets.AddEventHandler(byVMI)
	return c
}

func (c *Controller) enqueue(obj any) { worker.Enqueue(c.queue, obj) }

func (c *Controller) enqueueForVMI(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	o, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	name := o.GetName()
	if _, isVMI := obj.(*v1alpha1.VirtualMachineInstance); !isVMI {
		name = o.GetLabels()[v1alpha1.LabelVMIName] // a launcher pod or a budget
	}
	ms, err := c.migrations.VirtualMachineInstanceMigrations(o.GetNamespace()).List(labels.Everything())
	if err != nil {
		return
	}
	for _, m := range ms {
		if m.Spec.VMIName == name {
			c.queue.Add(m.Namespace + "/" + m.Name)
		}
	}
}

// Run processes the queue with workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return worker.Run(ctx, "migration", c.queue, c.synced, workers, func(ctx context.Context, key string) (time.Duration, error) {
		return c.sync(ctx, key)
	}, c.log)
}

// budgetCoversTarget reports whether the VMI's disruption budget already keeps the target pod
// as well as the source (seed 000: it grows before the target pod is created), so that no
// eviction can take the source in between; a VMI that needs no budget, or has one lifeboat does
// not manage, is not waited for.
func (c *Controller) budgetCoversTarget(v *v1alpha1.VirtualMachineInstance) bool {
	pods, err := c.pods.Pods(v.Namespace).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelVMIUID: string(v.UID)}))
	if err != nil {
		return false
	}
	want := disruption.MinAvailable(v, c.config(), pods, true)
	if want == 0 {
		return true
	}
	b, err := c.budgets.PodDisruptionBudgets(v.Namespace).Get(disruption.BudgetName(v))
	if err != nil {
		return false
	}
	return !metav1.IsControlledBy(b, v) || b.Spec.MinAvailable == nil || b.Spec.MinAvailable.IntValue() >= int(want)
}

// config is the cluster's LifeboatConfig, nil if there is none.
func (c *Controller) config() *v1alpha1.LifeboatConfig {
	config, err := c.configs.Get(v1alpha1.ConfigName)
	if err != nil {
		return nil
	}
	return config
}

// limits are the pending timeouts the cluster's configuration sets now.
func (c *Controller) limits() Limits { return LimitsFrom(c.config()) }

// sync moves the migration on; a migration still waiting for its target is looked at again when
// its pending timeout or deadline comes, if nothing else changes first.
func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	cached, err := c.migrations.VirtualMachineInstanceMigrations(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	m := cached.DeepCopy()
	v, err := c.vmis.VirtualMachineInstances(ns).Get(m.Spec.VMIName)
	if apierrors.IsNotFound(err) {
		v = nil
	} else if err != nil {
		return 0, err
	}
	target, err := c.targetPod(m, v)
	if err != nil {
		return 0, err
	}
	if m.DeletionTimestamp != nil {
		return 0, c.cleanUp(ctx, m, target)
	}
	// The evacuation controller writes its record right after it makes the migration: a write
	// here before it would conflict with it, and both would retry (in a drain, at the head of
	// every first round). Its record's update brings the migration back.
	if wait := RecordWait(m, time.Now()); wait > 0 {
		return wait, nil
	}
	if !hasFinalizer(m) {
		m.Finalizers = append(m.Finalizers, FinalizerCleanup)
		if m, err = c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Update(ctx, m, metav1.UpdateOptions{}); err != nil {
			return 0, fmt.Errorf("adding the cleanup finalizer: %w", err)
		}
	}

	limits, now := c.limits(), metav1.Now()
	status, action, events := Next(m, c.placed(v, now), target, limits, now)
	var all []*v1alpha1.VirtualMachineInstanceMigration
	if action == CreateTargetPod {
		if all, err = c.migrations.List(labels.Everything()); err != nil {
			return 0, err
		}
		refusal, wait := Admit(m, all, ManualLimit(c.config()), now.Time)
		if wait > 0 {
			return wait, nil
		}
		if refusal != nil {
			status, action, events = Refused(status, refusal, now)
			c.refused.WithLabelValues(refusal.Kind).Inc()
			c.log.Info("migration refused", "migration", key, "refusal", refusal.Kind, "reason", refusal.Reason)
		}
	}
	switch action {
	case CreateTargetPod:
		if !c.budgetCoversTarget(v) {
			// The disruption controller grows the budget first; its change brings us back.
			break
		}
		nodes, err := c.nodes.List(labels.Everything())
		if err != nil {
			return 0, err
		}
		postCopy := PostCopyTarget(v1alpha1.PostCopyAllowed(c.config(), v), nodes, v.Status.NodeName)
		pod, err := vmi.NewTargetPod(v, m, c.opts, vmi.AllowedNodeDirectories(c.configs), postCopy)
		var refused *vmi.RefusedError
		if errors.As(err, &refused) {
			// The guest stays where it runs: the admin no longer allows its node paths.
			status.Phase, status.FailureReason = v1alpha1.MigrationFailed, "no target pod: "+refused.Reason
			events = append(events, Event{corev1.EventTypeWarning, vmi.ReasonNodePathRefused, refused.Reason})
			break
		}
		if err != nil {
			return 0, err
		}
		c.keepOff(pod, m, v, all, nodes, now.Time)
		if _, err := c.kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			c.recorder.Eventf(m, corev1.EventTypeWarning, "FailedCreate", "creating target pod %s: %v", pod.Name, err)
			return 0, fmt.Errorf("creating target pod %s: %w", pod.Name, err)
		}
	case DeleteTargetPod:
		if err := c.deletePod(ctx, target); err != nil {
			return 0, err
		}
	}
	changed := !apiequality.Semantic.DeepEqual(status, m.Status)
	m.Status = status
	if changed {
		if _, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).UpdateStatus(ctx, m, metav1.UpdateOptions{}); err != nil {
			return 0, fmt.Errorf("updating status to %s: %w", status.Phase, err)
		}
	}
	for _, e := range events {
		c.recorder.Event(m, e.Type, e.Reason, e.Message)
		if e.Reason == ReasonTargetNotReadyInTime {
			c.late.Inc()
			c.log.Warn("gave up a migration target that was not ready in time", "migration", key, "targetNode", status.TargetNode, "reason", e.Message)
			if v != nil {
				c.recorder.Eventf(v, corev1.EventTypeWarning, ReasonTargetNotReadyInTime, "migration %s gave up its target%s: %s", m.Name, avoided(status.TargetNode), e.Message)
			}
		}
	}
	_, recheck := Stalled(m, target, limits, now.Time)
	if v != nil {
		if _, late := TargetLate(m, target, v.Spec.Memory, limits.Bandwidth, now.Time); late > 0 && (recheck == 0 || late < recheck) {
			recheck = late
		}
	}
	return recheck, nil
}

// avoided says where a target given up on was, which the VM's next targets avoid.
func avoided(node string) string {
	if node == "" {
		return ""
	}
	return fmt.Sprintf(" on node %s (the VM's next targets avoid it for %s)", node, AvoidFor)
}

// keepOff keeps the new target pod off the nodes where the VM's recent targets never became
// ready, and off nodes whose kubelets stopped renewing their Leases while another node could
// take the pod (KeepOff), and says so.
func (c *Controller) keepOff(pod *corev1.Pod, m *v1alpha1.VirtualMachineInstanceMigration, v *v1alpha1.VirtualMachineInstance,
	all []*v1alpha1.VirtualMachineInstanceMigration, nodes []*corev1.Node, now time.Time) {
	avoid := AvoidNodes(all, m.Namespace, m.Spec.VMIName, now)
	leases, err := c.leases.List(labels.Everything())
	if err != nil {
		// Only a preference is lost: the target goes where the scheduler puts it.
		c.log.Warn("reading the nodes' Leases; stale nodes are not avoided", "migration", m.Namespace+"/"+m.Name, "err", err)
	}
	probe := pod.DeepCopy()
	vmi.KeepOff(probe, avoid)
	fit, _ := placement.TargetNodes(probe, v.Status.NodeName, nodes)
	keep := KeepOff(avoid, StaleNodes(leases), fit)
	if len(keep) == 0 {
		return
	}
	vmi.KeepOff(pod, keep)
	var why []string
	if len(avoid) > 0 {
		why = append(why, fmt.Sprintf("%s, where a target of this VM did not become ready within the last %s", strings.Join(avoid, ", "), AvoidFor))
	}
	if stale := slices.DeleteFunc(slices.Clone(keep), func(n string) bool { return slices.Contains(avoid, n) }); len(stale) > 0 {
		why = append(why, fmt.Sprintf("%s, whose kubelet stopped renewing its Lease while the other nodes' renew theirs", strings.Join(stale, ", ")))
	}
	c.log.Info("target pod keeps off nodes", "migration", m.Namespace+"/"+m.Name, "nodes", keep, "why", why)
	c.recorder.Eventf(m, corev1.EventTypeNormal, ReasonTargetAvoidsNodes, "target pod %s keeps off %s", pod.Name, strings.Join(why, "; and "))
}

// NewLeaseInformer watches the nodes' Leases (kube-node-lease), which the controller compares to
// keep targets off nodes whose kubelets stopped renewing theirs (StaleNodes); whoever calls New
// runs it.
func NewLeaseInformer(kube kubernetes.Interface) cache.SharedIndexInformer {
	return coordinationinformers.NewLeaseInformer(kube, corev1.NamespaceNodeLease, 0, cache.Indexers{})
}

// placed is v (nil: none) with the LiveMigratable condition the nodes call for now
// (placement.Placer): a migration of a VM no other node can take fails at once (Next), before
// the evacuation controller has written NoTargetNode on the VMI, and without waiting out the
// pending timeout. The VMI itself is not changed.
func (c *Controller) placed(v *v1alpha1.VirtualMachineInstance, now metav1.Time) *v1alpha1.VirtualMachineInstance {
	if v == nil {
		return nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return v
	}
	cond := placement.NewPlacer(nodes).Condition(v, now)
	if cond == nil {
		return v
	}
	v = v.DeepCopy()
	meta.SetStatusCondition(&v.Status.Conditions, *cond)
	return v
}

// targetPod is the migration's target pod, if it exists.
func (c *Controller) targetPod(m *v1alpha1.VirtualMachineInstanceMigration, v *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	if v == nil {
		return nil, nil
	}
	pod, err := c.pods.Pods(m.Namespace).Get(vmi.TargetPodName(v, m))
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err == nil && !metav1.IsControlledBy(pod, v) {
		// Someone else's pod under the target's name is not the target: it is never recorded.
		return nil, nil
	}
	return pod, err
}

// cleanUp cancels: the source agent aborts a running transfer when it sees the deletion; the
// target pod goes unless the guest already runs there.
func (c *Controller) cleanUp(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration, target *corev1.Pod) error {
	if m.Status.Phase != v1alpha1.MigrationSucceeded && target != nil {
		if err := c.deletePod(ctx, target); err != nil {
			return err
		}
		c.recorder.Eventf(m, corev1.EventTypeNormal, "Cancelled", "migration deleted before it finished; deleted target pod %s", target.Name)
	}
	if !hasFinalizer(m) {
		return nil
	}
	var keep []string
	for _, f := range m.Finalizers {
		if f != FinalizerCleanup {
			keep = append(keep, f)
		}
	}
	m.Finalizers = keep
	_, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(m.Namespace).Update(ctx, m, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the cleanup finalizer: %w", err)
	}
	return nil
}

func (c *Controller) deletePod(ctx context.Context, pod *corev1.Pod) error {
	if pod.DeletionTimestamp != nil {
		return nil
	}
	err := c.kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting target pod %s: %w", pod.Name, err)
	}
	return nil
}

func hasFinalizer(m *v1alpha1.VirtualMachineInstanceMigration) bool {
	for _, f := range m.Finalizers {
		if f == FinalizerCleanup {
			return true
		}
	}
	return false
}
