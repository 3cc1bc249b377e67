// Package vmi is the VMI controller: it gives each VirtualMachineInstance one launcher pod,
// drives the VMI's phase from that pod, and on deletion lets the guest shut down before the
// pod and the VMI go.
package vmi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// Controller reconciles VirtualMachineInstances with their launcher pods.
type Controller struct {
	kube     kubernetes.Interface
	lifeboat lifeboatclient.Interface
	vmis     lifeboatlisters.VirtualMachineInstanceLister
	configs  lifeboatlisters.LifeboatConfigLister
	pods     corelisters.PodLister
	claims   corelisters.PersistentVolumeClaimLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	opts     PodOptions
	now      func() metav1.Time
	log      *slog.Logger
}

// New wires the controller to its informers. The pod informer should be filtered to launcher pods;
// the node informer holds every Node (a guest on a node that stops answering waits for it).
func New(kube kubernetes.Interface, lb lifeboatclient.Interface, vmiInformer lifeboatinformers.VirtualMachineInstanceInformer,
	configInformer lifeboatinformers.LifeboatConfigInformer, podInformer coreinformers.PodInformer,
	claimInformer coreinformers.PersistentVolumeClaimInformer, nodeInformer cache.SharedIndexInformer,
	recorder record.EventRecorder, opts PodOptions, log *slog.Logger) *Controller {
	c := &Controller{
		kube: kube, lifeboat: lb,
		vmis: vmiInformer.Lister(), configs: configInformer.Lister(), pods: podInformer.Lister(), claims: claimInformer.Lister(),
		nodes: corelisters.NewNodeLister(nodeInformer.GetIndexer()),
		synced: []cache.InformerSynced{vmiInformer.Informer().HasSynced, configInformer.Informer().HasSynced,
			podInformer.Informer().HasSynced, claimInformer.Informer().HasSynced, nodeInformer.HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "vmi"}),
		recorder: recorder,
		opts:     opts,
		now:      metav1.Now,
		log:      log.With("controller", "vmi"),
	}
	_, _ = vmiInformer.Informer().AddEventHandler(worker.Handler(c.enqueue))
	// A VMI refused for its node paths may start once the admin allows them.
	_, _ = configInformer.Informer().AddEventHandler(worker.Handler(func(any) { c.enqueuePending() }))
	// A VMI waiting for its claim starts once the claim is there.
	_, _ = claimInformer.Informer().AddEventHandler(worker.Handler(func(any) { c.enqueuePending() }))
	// A node that stops answering, is tainted out of service, answers again or is deleted
	// changes what its VMIs may do.
	_, _ = nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueueOnNode,
		UpdateFunc: func(old, obj any) {
			if nodeLossChanged(old, obj) {
				c.enqueueOnNode(obj)
			}
		},
		DeleteFunc: c.enqueueOnNode,
	})
	_, _ = podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueOwner,
		UpdateFunc: func(_, obj any) { c.enqueueOwner(obj) },
		DeleteFunc: c.enqueueOwner,
	})
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

// enqueuePending enqueues the VMIs that have no launcher pod yet.
func (c *Controller) enqueuePending() {
	vmis, err := c.vmis.List(labels.Everything())
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, v := range vmis {
		if v.Status.Phase == "" || v.Status.Phase == v1alpha1.VMIPending {
			c.enqueue(v)
		}
	}
}

// enqueueOnNode enqueues the VMIs whose guest runs on the node.
func (c *Controller) enqueueOnNode(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	vmis, err := c.vmis.List(labels.Everything())
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, v := range vmis {
		if v.Status.NodeName == node.Name && !v.Status.Phase.Terminal() {
			c.enqueue(v)
		}
	}
}

// nodeLossChanged reports whether a Node update changes what DecideNodeLoss says: its Ready
// condition's status or its taints (a heartbeat alone does not).
func nodeLossChanged(old, obj any) bool {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := obj.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	ro, rn := readyCondition(o), readyCondition(n)
	if (ro == nil) != (rn == nil) || (ro != nil && (ro.Status != rn.Status || ro.LastTransitionTime != rn.LastTransitionTime || ro.Message != rn.Message)) {
		return true
	}
	return !apiequality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints)
}

// node is the Node named name from the cache, nil if there is none.
func (c *Controller) node(name string) *corev1.Node {
	n, err := c.nodes.Get(name)
	if err != nil {
		return nil
	}
	return n
}

// enqueueOwner maps a launcher pod to the VMI that controls it.
func (c *Controller) enqueueOwner(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if ref := v1alpha1.VMIController(pod); ref != nil {
		c.queue.Add(pod.Namespace + "/" + ref.Name)
	}
}

// AllowedNodeDirectories are the node directories the cluster's LifeboatConfig allows VMIs to
// boot from; none when there is no LifeboatConfig.
func AllowedNodeDirectories(configs lifeboatlisters.LifeboatConfigLister) []string {
	cfg, err := configs.Get(v1alpha1.ConfigName)
	if err != nil {
		return nil
	}
	return cfg.Spec.AllowedNodeDirectories
}

// Run processes the queue with the given number of workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return worker.Run(ctx, "vmi", c.queue, c.synced, workers, c.sync, c.log)
}

// sync reconciles the VMI key; the duration says when to look again although nothing changed.
func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil // a malformed key never becomes valid
	}
	cached, err := c.vmis.VirtualMachineInstances(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil // its pods go with it through their owner reference
	}
	if err != nil {
		return 0, err
	}
	vmi := cached.DeepCopy()
	owned, err := c.ownedPods(vmi)
	if err != nil {
		return 0, err
	}
	pod := ActivePod(vmi, owned)

	if vmi.DeletionTimestamp != nil {
		return 0, c.syncDeleted(ctx, vmi, pod)
	}
	if !hasFinalizer(vmi) {
		vmi.Finalizers = append(vmi.Finalizers, v1alpha1.FinalizerShutdown)
		if vmi, err = c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(namespace).Update(ctx, vmi, metav1.UpdateOptions{}); err != nil {
			return 0, fmt.Errorf("adding the shutdown finalizer: %w", err)
		}
	}
	if pod == nil && (vmi.Status.Phase == "" || vmi.Status.Phase == v1alpha1.VMIPending) {
		if pod, err = c.createLauncherPod(ctx, vmi); err != nil {
			return 0, err
		}
	} else if pod != nil && vmi.Status.VolumeStatus == nil {
		// The status write after the pod's creation was lost: record the claims now.
		if volumes, err := ClaimStatuses(vmi, c.claims.PersistentVolumeClaims(vmi.Namespace).Get); err == nil {
			vmi.Status.VolumeStatus = volumes
		}
	}
	if err := c.updateStatus(ctx, vmi, pod); err != nil {
		return 0, err
	}
	held, err := c.syncGuestGates(ctx, vmi, owned)
	if err != nil {
		return 0, err
	}
	again, err := c.deleteStillReadyWithoutGuest(ctx, vmi, owned)
	if held > 0 && (again == 0 || held < again) {
		again = held
	}
	return again, err
}

// ownedPods are the launcher pods the VMI controls: its own and its migrations' targets.
func (c *Controller) ownedPods(vmi *v1alpha1.VirtualMachineInstance) ([]*corev1.Pod, error) {
	pods, err := c.pods.Pods(vmi.Namespace).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelVMIUID: string(vmi.UID)}))
	if err != nil {
		return nil, err
	}
	owned := pods[:0:0]
	for _, p := range pods {
		if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == vmi.UID {
			owned = append(owned, p)
		}
	}
	return owned, nil
}

func (c *Controller) createLauncherPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	volumes, err := ClaimStatuses(vmi, c.claims.PersistentVolumeClaims(vmi.Namespace).Get)
	var claimErr *ClaimError
	if errors.As(err, &claimErr) {
		// Permanent until the claim changes, which requeues the VMI.
		c.recorder.Event(vmi, corev1.EventTypeWarning, claimErr.Reason, claimErr.Message)
		c.log.Info("no launcher pod yet", "vmi", vmi.Namespace+"/"+vmi.Name, "reason", claimErr.Message)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Recorded with the status (updateStatus), and read by the launcher and the agent from there.
	vmi.Status.VolumeStatus = volumes
	pod, err := NewLauncherPod(vmi, c.opts, AllowedNodeDirectories(c.configs))
	var refused *RefusedError
	if errors.As(err, &refused) {
		// Permanent until the VMI or the configuration changes, and both requeue it.
		c.recorder.Event(vmi, corev1.EventTypeWarning, ReasonNodePathRefused, refused.Reason)
		c.log.Info("refused a launcher pod", "vmi", vmi.Namespace+"/"+vmi.Name, "reason", refused.Reason)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	created, err := c.kube.CoreV1().Pods(vmi.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Our cache is behind; the pod's informer event will bring us back.
		return nil, nil
	}
	if err != nil {
		c.recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonFailedCreate, "creating launcher pod %s: %v", pod.Name, err)
		return nil, fmt.Errorf("creating launcher pod %s: %w", pod.Name, err)
	}
	c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonSuccessfulCreate, "created launcher pod %s", created.Name)
	c.log.Info("created launcher pod", "vmi", vmi.Namespace+"/"+vmi.Name, "pod", created.Name)
	return created, nil
}

func (c *Controller) updateStatus(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) error {
	status, events := NextStatus(vmi, pod, c.node, c.now())
	if !apiequality.Semantic.DeepEqual(status, vmi.Status) {
		vmi.Status = status
		if _, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating status to %s: %w", status.Phase, err)
		}
	}
	for _, e := range events {
		c.recorder.Event(vmi, e.Type, e.Reason, e.Message)
	}
	return nil
}

// syncDeleted lets the guest shut down: deleting the pod sends the launcher SIGTERM, the agent
// sees the VMI is being deleted and powers the guest off (ACPI, then destroy at its grace
// period). Once the pod is gone, the finalizer goes and the VMI with it.
func (c *Controller) syncDeleted(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) error {
	if pod != nil {
		if pod.DeletionTimestamp == nil {
			err := c.kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting launcher pod %s: %w", pod.Name, err)
			}
			c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonShuttingDown, "shutting the guest down: deleting launcher pod %s", pod.Name)
		}
		if err := c.forceDeleteOnLostNode(ctx, vmi, pod); err != nil {
			return err
		}
		if err := c.updateStatus(ctx, vmi, pod); err != nil {
			return err
		}
		return nil // the pod's deletion brings us back
	}
	if !hasFinalizer(vmi) {
		return nil
	}
	finalizers := vmi.Finalizers[:0]
	for _, f := range vmi.Finalizers {
		if f != v1alpha1.FinalizerShutdown {
			finalizers = append(finalizers, f)
		}
	}
	vmi.Finalizers = finalizers
	if _, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Update(ctx, vmi, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the shutdown finalizer: %w", err)
	}
	return nil
}

func hasFinalizer(vmi *v1alpha1.VirtualMachineInstance) bool {
	for _, f := range vmi.Finalizers {
		if f == v1alpha1.FinalizerShutdown {
			return true
		}
	}
	return false
}

// forceDeleteOnLostNode removes the launcher pod of a deleted VMI from the API server when its
// node does not answer but is known to have stopped the guest (DecideNodeLoss): no kubelet will
// carry the deletion out, and the VMI, and with it a VM's next instance of the same name, waits
// for the pod. On an out-of-service node Kubernetes' pod GC does the same; this does not wait
// for it. On a node that may still run the guest the pod stays.
func (c *Controller) forceDeleteOnLostNode(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) error {
	if pod.Spec.NodeName == "" {
		return nil
	}
	loss := DecideNodeLoss(NodeLossInput{NodeName: pod.Spec.NodeName, Node: c.node(pod.Spec.NodeName), Pod: pod,
		AgentReportedGuestGone: agentReportedGuestGone(&vmi.Status)})
	if loss.Verdict != GuestGone || loss.NodeReady {
		return nil
	}
	err := c.kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("force-deleting launcher pod %s: %w", pod.Name, err)
	}
	c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonForceDeleted, "force-deleted launcher pod %s: %s", pod.Name, loss.Message)
	c.log.Info("force-deleted the launcher pod of a lost node", "vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "node", pod.Spec.NodeName, "reason", loss.Reason)
	return nil
}
