// Package hollow stands in for the kubelets and lifeboat agents of many nodes at once, as
// kubemark's hollow nodes do for Kubernetes' own scale tests: Node objects whose leases are
// renewed as a kubelet renews them, pods bound to them reported Running without any process, and
// VMIs whose launcher pods run there reported Running by the agent's own decision (agent.Decide,
// with a running domain). What runs on them costs nothing, so what a benchmark on them measures
// is the cluster side: lifeboat-controller, the scheduler and the API server.
package hollow

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lbinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lblisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Label marks hollow Nodes, so that a test can tell them from real and emulated ones.
const Label = "test.lifeboat.dev/hollow"

// A kubelet's lease timings (its defaults).
const (
	leaseDuration      = 40
	leaseRenewInterval = 10 * time.Second
)

// workers is how many pods and VMIs the stand-ins write at once: enough that they are never
// the bottleneck of the components under test.
const workers = 8

// Nodes are n hollow nodes and the stand-ins that run what is bound to them.
type Nodes struct {
	kube   kubernetes.Interface
	lb     versioned.Interface
	names  map[string]bool
	pods   corelisters.PodLister
	vmis   lblisters.VirtualMachineInstanceLister
	podQ   workqueue.TypedRateLimitingInterface[string]
	vmiQ   workqueue.TypedRateLimitingInterface[string]
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start registers n Nodes named prefix-000 onwards, each with capacity (plus 110 of every
// lifeboat device, which their agents' device plugins would advertise), and runs the stand-ins
// until Stop.
func Start(ctx context.Context, kube kubernetes.Interface, lb versioned.Interface, prefix string, n int, capacity corev1.ResourceList) (*Nodes, error) {
	h := &Nodes{kube: kube, lb: lb, names: map[string]bool{},
		podQ: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		vmiQ: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancel = cancel
	for i := range n {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		if _, err := kube.CoreV1().Nodes().Create(ctx, nodeObject(name, capacity), metav1.CreateOptions{}); err != nil {
			h.Stop(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("registering hollow node %s: %w", name, err)
		}
		h.names[name] = true
		c := lease.NewController(clock.RealClock{}, kube, name, leaseDuration, nil, leaseRenewInterval, name, corev1.NamespaceNodeLease, nil)
		h.wg.Go(func() { c.Run(runCtx) })
	}

	kubeInformers := informers.NewSharedInformerFactory(kube, 0)
	podInformer := kubeInformers.Core().V1().Pods()
	h.pods = podInformer.Lister()
	lbInformers := lbinformers.NewSharedInformerFactory(lb, 0)
	vmiInformer := lbInformers.Lifeboat().V1alpha1().VirtualMachineInstances()
	h.vmis = vmiInformer.Lister()
	onPod := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !h.names[pod.Spec.NodeName] {
			return
		}
		key, _ := cache.MetaNamespaceKeyFunc(pod)
		h.podQ.Add(key)
		if name := pod.Labels[v1alpha1.LabelVMIName]; name != "" {
			h.vmiQ.Add(pod.Namespace + "/" + name)
		}
	}
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, obj any) { onPod(obj) },
	}); err != nil {
		h.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	onVMI := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			h.vmiQ.Add(key)
		}
	}
	if _, err := vmiInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onVMI, UpdateFunc: func(_, obj any) { onVMI(obj) },
	}); err != nil {
		h.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	kubeInformers.Start(runCtx.Done())
	lbInformers.Start(runCtx.Done())
	for _, synced := range []cache.InformerSynced{podInformer.Informer().HasSynced, vmiInformer.Informer().HasSynced} {
		if !cache.WaitForCacheSync(ctx.Done(), synced) {
			h.Stop(context.WithoutCancel(ctx))
			return nil, errors.New("the hollow nodes' caches did not sync")
		}
	}
	for range workers {
		h.wg.Go(func() { work(runCtx, h.podQ, h.syncPod) })
		h.wg.Go(func() { work(runCtx, h.vmiQ, h.syncVMI) })
	}
	return h, nil
}

// Stop ends the stand-ins and deletes the Nodes and their Leases.
func (h *Nodes) Stop(ctx context.Context) {
	h.cancel()
	h.podQ.ShutDown()
	h.vmiQ.ShutDown()
	h.wg.Wait()
	for name := range h.names {
		_ = h.kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
		_ = h.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

func nodeObject(name string, capacity corev1.ResourceList) *corev1.Node {
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	for _, d := range []string{v1alpha1.DeviceKVM, v1alpha1.DeviceTun, v1alpha1.DeviceUserFaultFD} {
		resources[corev1.ResourceName(d)] = resource.MustParse("110")
	}
	for k, v := range capacity {
		resources[k] = v
	}
	now := metav1.Now()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelHostname: name, v1alpha1.LabelKVMNode: "true", Label: "true",
		}},
		Status: corev1.NodeStatus{
			Capacity: resources, Allocatable: resources,
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastHeartbeatTime: now, LastTransitionTime: now},
			},
			// Nothing dials a hollow node; its address is loopback so that nothing could.
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}},
		},
	}
}

// work runs sync for each key of q until q shuts down, retrying failures with q's back-off.
func work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		if err := sync(ctx, key); err != nil && ctx.Err() == nil {
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

// syncPod is the kubelet's part: a pod bound here runs at once, and a deleted one is gone at once
// (its containers have nothing to stop).
func (h *Nodes) syncPod(ctx context.Context, key string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	pod, err := h.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil {
		err := h.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64),
			Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "" {
		return nil
	}
	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase, pod.Status.HostIP, pod.Status.PodIP, pod.Status.StartTime = corev1.PodRunning, "127.0.0.1", "127.0.0.1", &now
	pod.Status.HostIPs, pod.Status.PodIPs = []corev1.HostIP{{IP: "127.0.0.1"}}, []corev1.PodIP{{IP: "127.0.0.1"}}
	ready := corev1.ConditionTrue
	if len(pod.Spec.ReadinessGates) > 0 {
		ready = corev1.ConditionFalse
	}
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err = h.kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone, or changed since the cache saw it: the change brings the pod back to the queue.
		return nil
	}
	return err
}

// syncVMI is the agent's part for a VMI starting on a hollow node: once its launcher pod runs
// there, the guest's domain runs, and the VMI gets the status agent.Decide gives a running
// domain. Migrations are not carried out: a target pod's guest never arrives.
func (h *Nodes) syncVMI(ctx context.Context, key string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	vmi, err := h.vmis.VirtualMachineInstances(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || vmi.Status.Phase == v1alpha1.VMIRunning || vmi.Status.Phase.Terminal() || vmi.DeletionTimestamp != nil {
		return err
	}
	pods, err := h.pods.Pods(ns).List(labelsOf(vmi))
	if err != nil {
		return err
	}
	var node string
	for _, p := range pods {
		if p.Labels[launcher.LabelMigrationUID] == "" && p.Status.Phase == corev1.PodRunning && h.names[p.Spec.NodeName] {
			node = p.Spec.NodeName
		}
	}
	if node == "" {
		return nil
	}
	dom := &agent.Domain{State: agent.DomainRunning}
	dom.NotMigratableReason, dom.NotMigratableMessage = agent.NotMigratable(vmi)
	plan := agent.Decide(vmi, dom, agent.Eviction{}, node, time.Now())
	if plan.Status == nil || reflect.DeepEqual(*plan.Status, vmi.Status) {
		return nil
	}
	vmi = vmi.DeepCopy()
	vmi.Status = *plan.Status
	_, err = h.lb.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// labelsOf selects the pods of vmi.
func labelsOf(vmi *v1alpha1.VirtualMachineInstance) labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1alpha1.LabelVMIUID: string(vmi.UID)})
}
