package responder

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	lifecycleac "k8s.io/client-go/applyconfigurations/lifecycle/v1alpha1"
	"k8s.io/client-go/discovery"
	coreinformers "k8s.io/client-go/informers/core/v1"
	lifecycleinformers "k8s.io/client-go/informers/lifecycle/v1alpha1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	lifecyclelisters "k8s.io/client-go/listers/lifecycle/v1alpha1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/cancellation"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// FieldManager owns lifeboat's status.responders[] entry (server-side apply).
const FieldManager = "lifeboat-responder"

// EvictionSelector selects the Evictions the evictionrequest controller labels for lifeboat as a
// responder: the label key is the responder's name, the value its role.
var EvictionSelector = v1alpha1.EvictionResponderName + " in (" + string(lifecyclev1alpha1.EvictionParticipantRoleResponder) +
	"," + string(lifecyclev1alpha1.EvictionParticipantRoleRequesterResponder) + ")"

// Served reports whether the API server serves Evictions (lifecycle.k8s.io/v1alpha1) with the
// status subresource lifeboat writes.
func Served(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(lifecyclev1alpha1.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", lifecyclev1alpha1.SchemeGroupVersion, err)
	}
	var evictions, status bool
	for _, r := range list.APIResources {
		evictions = evictions || r.Name == "evictions"
		status = status || r.Name == "evictions/status"
	}
	return evictions && status, nil
}

// Informers are the caches the responder reads. Evictions should be filtered with
// EvictionSelector, Pods to launcher pods.
type Informers struct {
	Evictions  lifecycleinformers.EvictionInformer
	Pods       coreinformers.PodInformer
	VMIs       lifeboatinformers.VirtualMachineInstanceInformer
	Migrations lifeboatinformers.VirtualMachineInstanceMigrationInformer
	Configs    lifeboatinformers.LifeboatConfigInformer
}

const podUIDIndex = "targetPodUID"

// Controller answers the Evictions of launcher pods.
type Controller struct {
	kube       kubernetes.Interface
	lifeboat   lifeboatclient.Interface
	evictions  lifecyclelisters.EvictionLister
	evIndex    cache.Indexer
	pods       corelisters.PodLister
	vmis       lifeboatlisters.VirtualMachineInstanceLister
	migrations lifeboatlisters.VirtualMachineInstanceMigrationLister
	configs    lifeboatlisters.LifeboatConfigLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	metrics    *Metrics
	settings   Settings
	now        func() time.Time
	log        *slog.Logger

	mu     sync.Mutex
	memory map[types.UID]*memory
}

// New wires the responder to its informers.
func New(kube kubernetes.Interface, lb lifeboatclient.Interface, inf Informers, recorder record.EventRecorder, metrics *Metrics, settings Settings, log *slog.Logger) (*Controller, error) {
	if err := settings.Validate(); err != nil {
		return nil, err
	}
	evInformer := inf.Evictions.Informer()
	if err := evInformer.AddIndexers(cache.Indexers{podUIDIndex: targetPodUID}); err != nil {
		return nil, err
	}
	c := &Controller{
		kube: kube, lifeboat: lb,
		evictions: inf.Evictions.Lister(), evIndex: evInformer.GetIndexer(),
		pods: inf.Pods.Lister(), vmis: inf.VMIs.Lister(), migrations: inf.Migrations.Lister(), configs: inf.Configs.Lister(),
		synced: []cache.InformerSynced{evInformer.HasSynced, inf.Pods.Informer().HasSynced, inf.VMIs.Informer().HasSynced,
			inf.Migrations.Informer().HasSynced, inf.Configs.Informer().HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "responder"}),
		recorder: recorder, metrics: metrics, settings: settings, now: time.Now,
		log:    log.With("controller", "responder"),
		memory: map[types.UID]*memory{},
	}
	_, _ = evInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
		DeleteFunc: c.forget,
	})
	for _, i := range []cache.SharedIndexInformer{inf.Pods.Informer(), inf.VMIs.Informer(), inf.Migrations.Informer()} {
		_, _ = i.AddEventHandler(worker.Handler(c.enqueueRelated))
	}
	return c, nil
}

func targetPodUID(obj any) ([]string, error) {
	ev, ok := obj.(*lifecyclev1alpha1.Eviction)
	if !ok || ev.Spec.Target.Pod == nil {
		return nil, nil
	}
	return []string{string(ev.Spec.Target.Pod.UID)}, nil
}

func (c *Controller) enqueue(obj any) { worker.Enqueue(c.queue, obj) }

func (c *Controller) forget(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if ev, ok := obj.(*lifecyclev1alpha1.Eviction); ok {
		c.mu.Lock()
		delete(c.memory, ev.UID)
		c.mu.Unlock()
	}
}

// enqueueRelated maps a launcher pod, a VMI or a migration to the Evictions of the VMI's pods.
func (c *Controller) enqueueRelated(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	var vmiUID string
	switch o := obj.(type) {
	case *corev1.Pod:
		vmiUID = o.Labels[v1alpha1.LabelVMIUID]
	case *v1alpha1.VirtualMachineInstance:
		vmiUID = string(o.UID)
	case *v1alpha1.VirtualMachineInstanceMigration:
		vmiUID = o.Labels[v1alpha1.LabelVMIUID]
	}
	if vmiUID == "" {
		return
	}
	pods, err := c.pods.List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelVMIUID: vmiUID}))
	if err != nil {
		return
	}
	for _, p := range pods {
		evs, _ := c.evIndex.ByIndex(podUIDIndex, string(p.UID))
		for _, ev := range evs {
			c.enqueue(ev)
		}
	}
}

// Run processes the queue with the given number of workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return worker.Run(ctx, "responder", c.queue, c.synced, workers, c.sync, c.log)
}

func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	ev, err := c.evictions.Evictions(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	obs, err := c.observe(c.freshest(ev))
	if err != nil {
		return 0, err
	}
	plan := Decide(obs, c.settings, c.now())
	log := c.log.With("eviction", key)
	if plan.Mark != "" {
		if err := c.setMark(ctx, obs, plan.Mark); err != nil {
			return 0, err
		}
		log.Info("marked the VM for evacuation", "vmi", obs.VMI.Name, "node", obs.Pod.Spec.NodeName)
	}
	if plan.ClearMark != "" {
		if err := c.clearMark(ctx, obs, plan.ClearMark); err != nil {
			return 0, err
		}
		// As a cancel request does: no migration starts only to be aborted.
		deleted, err := cancellation.DeleteUnstarted(ctx, c.lifeboat, c.migrations, obs.VMI)
		if err != nil {
			return 0, err
		}
		log.Info("stopped the evacuation: cleared the mark", "vmi", obs.VMI.Name, "why", plan.ClearMark, "deletedMigrations", deleted)
	}
	if plan.Write != nil {
		if err := c.apply(ctx, ev, plan.Write); err != nil {
			return 0, err
		}
		log.Info("reported on the eviction", "heartbeat", plan.Write.Heartbeat.UTC(), "completed", plan.Write.Completion != nil, "message", plan.Write.Message)
	}
	if plan.Outcome != "" && c.firstAnswer(ev) {
		c.metrics.Answered.WithLabelValues(plan.Outcome).Inc()
		log.Info("answered the eviction", "outcome", plan.Outcome)
	}
	for _, e := range plan.Events {
		c.tell(ev, e)
	}
	return plan.RequeueAfter, nil
}

// observe gathers the Eviction's target: a launcher pod with the target's UID, its VMI and the
// VMI's newest evacuation migration off the pod's node since the Eviction was made.
func (c *Controller) observe(ev *lifecyclev1alpha1.Eviction) (Observation, error) {
	obs := Observation{Eviction: ev}
	target := ev.Spec.Target.Pod
	if target == nil {
		return obs, nil
	}
	pod, err := c.pods.Pods(ev.Namespace).Get(target.Name)
	if apierrors.IsNotFound(err) {
		return obs, nil // not a launcher pod, or gone: the evictionrequest controller handles that
	}
	if err != nil {
		return obs, err
	}
	ref := v1alpha1.VMIController(pod)
	if pod.UID != target.UID || pod.Labels[v1alpha1.LabelRole] != v1alpha1.RoleLauncher || ref == nil {
		return obs, nil
	}
	obs.Pod = pod
	if config, err := c.configs.Get(v1alpha1.ConfigName); err == nil {
		obs.Config = config
	}
	vmi, err := c.vmis.VirtualMachineInstances(ev.Namespace).Get(ref.Name)
	if apierrors.IsNotFound(err) || (err == nil && vmi.UID != ref.UID) {
		return obs, nil
	}
	if err != nil {
		return obs, err
	}
	obs.VMI = vmi
	migrations, err := c.migrations.VirtualMachineInstanceMigrations(ev.Namespace).List(labels.Everything())
	if err != nil {
		return obs, err
	}
	for _, m := range migrations {
		// The evacuation's migrations are those the evacuation controller recorded as such.
		if m.EvacuatedVMI() != vmi.UID || m.CreationTimestamp.Before(&ev.CreationTimestamp) || (m.Status.SourceNode != "" && m.Status.SourceNode != pod.Spec.NodeName) {
			continue
		}
		if obs.Migration == nil || obs.Migration.CreationTimestamp.Before(&m.CreationTimestamp) {
			obs.Migration = m
		}
	}
	return obs, nil
}

// setMark marks the VMI for evacuation from the pod's node, the way every path marks it: the
// evacuation controller takes it from there.
func (c *Controller) setMark(ctx context.Context, obs Observation, msg string) error {
	node := obs.Pod.Spec.NodeName
	return c.updateVMIStatus(ctx, obs.VMI, func(v *v1alpha1.VirtualMachineInstance) bool {
		if v.Status.NodeName != node || v.Status.EvacuationNodeName == node {
			return false // moved meanwhile, or marked by another path
		}
		v.Status.EvacuationNodeName = node
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue,
			Reason: string(v1alpha1.MigrationCauseEvictionRequest), Message: msg, LastTransitionTime: metav1.NewTime(c.now())})
		return true
	})
}

// clearMark clears the mark if it is still this Eviction's: the source agent then cancels an
// unfinished pre-copy migration.
func (c *Controller) clearMark(ctx context.Context, obs Observation, msg string) error {
	node := obs.Pod.Spec.NodeName
	return c.updateVMIStatus(ctx, obs.VMI, func(v *v1alpha1.VirtualMachineInstance) bool {
		if !marked(v, node) || !markedByEviction(v) {
			return false
		}
		v.Status.EvacuationNodeName = ""
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionFalse,
			Reason: "EvictionCanceled", Message: msg, LastTransitionTime: metav1.NewTime(c.now())})
		return true
	})
}

// updateVMIStatus applies change to the VMI's newest status and writes it if change says so.
func (c *Controller) updateVMIStatus(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, change func(*v1alpha1.VirtualMachineInstance) bool) error {
	client := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := client.Get(ctx, vmi.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v.UID != vmi.UID || !change(v) {
			return nil
		}
		_, err = client.UpdateStatus(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("writing the evacuation mark of VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return nil
}

// apply writes lifeboat's own status.responders[] entry by server-side apply, so it never
// touches another responder's entry or the evictionrequest controller's fields. A rejection is
// logged with the server's reason, counted, told on the Eviction and retried with backoff.
func (c *Controller) apply(ctx context.Context, ev *lifecyclev1alpha1.Eviction, w *Write) error {
	entry := lifecycleac.ResponderStatus().WithName(v1alpha1.EvictionResponderName).WithHeartbeatTime(w.Heartbeat).WithMessage(w.Message)
	if w.Expected != nil {
		entry.WithExpectedCompletionTime(*w.Expected)
	}
	if w.Completion != nil {
		entry.WithCompletionTime(*w.Completion)
	}
	ac := lifecycleac.Eviction(ev.Name, ev.Namespace).WithStatus(lifecycleac.EvictionStatus().WithResponders(entry))
	written, err := c.kube.LifecycleV1alpha1().Evictions(ev.Namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err == nil {
		c.remember(written)
		return nil
	}
	reason := apierrors.ReasonForError(err)
	c.metrics.WriteFailures.WithLabelValues(string(reason)).Inc()
	c.log.Error("the API server rejected the responder's status", "eviction", ev.Namespace+"/"+ev.Name, "reason", reason, "err", err)
	if reason == metav1.StatusReasonInvalid {
		c.recorder.Eventf(ev, corev1.EventTypeWarning, ReasonRejectedByServer, "the API server rejected lifeboat's status: %v", err)
	}
	return fmt.Errorf("applying the responder status of eviction %s/%s: %w", ev.Namespace, ev.Name, err)
}

// memory is what the responder remembers of an Eviction between syncs.
type memory struct {
	// told are the Events already recorded, so a repeated sync tells once.
	told map[Event]bool
	// answered is set once the Eviction's outcome is counted.
	answered bool
	// written is lifeboat's entry as the API server returned it after the last write: the
	// informer's copy may lag behind it, and deciding from that copy would heartbeat too soon
	// or set completionTime a second time.
	written *lifecyclev1alpha1.ResponderStatus
}

func (c *Controller) memoryOf(uid types.UID) *memory {
	m := c.memory[uid]
	if m == nil {
		m = &memory{told: map[Event]bool{}}
		c.memory[uid] = m
	}
	return m
}

// freshest is the Eviction with lifeboat's entry as last written, where the cache lags behind.
func (c *Controller) freshest(ev *lifecyclev1alpha1.Eviction) *lifecyclev1alpha1.Eviction {
	c.mu.Lock()
	defer c.mu.Unlock()
	written := c.memoryOf(ev.UID).written
	entry := Entry(ev)
	if written == nil || entry == nil || !behind(entry, written) {
		return ev
	}
	ev = ev.DeepCopy()
	*Entry(ev) = *written.DeepCopy()
	return ev
}

func behind(cached, written *lifecyclev1alpha1.ResponderStatus) bool {
	if written.CompletionTime != nil && cached.CompletionTime == nil {
		return true
	}
	return written.HeartbeatTime != nil && (cached.HeartbeatTime == nil || cached.HeartbeatTime.Before(written.HeartbeatTime))
}

func (c *Controller) remember(written *lifecyclev1alpha1.Eviction) {
	if e := Entry(written); e != nil {
		c.mu.Lock()
		c.memoryOf(written.UID).written = e.DeepCopy()
		c.mu.Unlock()
	}
}

// firstAnswer reports whether the Eviction's outcome is not counted yet, and marks it counted.
func (c *Controller) firstAnswer(ev *lifecyclev1alpha1.Eviction) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.memoryOf(ev.UID)
	first := !m.answered
	m.answered = true
	return first
}

// tell records an Event on the Eviction once.
func (c *Controller) tell(ev *lifecyclev1alpha1.Eviction, e Event) {
	c.mu.Lock()
	told := c.memoryOf(ev.UID).told
	done := told[e]
	told[e] = true
	c.mu.Unlock()
	if !done {
		c.recorder.Event(ev, e.Type, e.Reason, e.Message)
	}
}
