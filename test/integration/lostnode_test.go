package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// A node that stops answering: its VMs wait, saying why, and start elsewhere only once the node
// is known to be off. These tests run lifeboat's VMI and VM controllers in this process against
// the real control plane (its scheduler, node lifecycle, taint eviction and pod GC controllers
// included) with Nodes that have no kubelet: the test writes their Ready condition and renews
// their Leases, and plays each node's agent (the VMI's Running status).

// startVMControllers runs the VMI and VM controllers until the test ends.
func startVMControllers(t *testing.T) {
	t.Helper()
	p := newInProcess(t)
	claims := informers.NewSharedInformerFactory(cluster.Kube, 0)
	lbv1 := p.lb.Lifeboat().V1alpha1()
	pods := p.launchers.Core().V1().Pods()
	nodes, _ := evacuate.NewCapacityInformers(cluster.Kube)
	vmis := vmi.New(cluster.Kube, cluster.Lifeboat, lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), pods,
		claims.Core().V1().PersistentVolumeClaims(), nodes, p.recorder, vmi.PodOptions{Image: "lifeboat-launcher:test", Acceleration: "tcg"}, p.log)
	vms := vm.New(cluster.Lifeboat, lbv1.VirtualMachines(), lbv1.VirtualMachineInstances(), pods, p.recorder, prometheus.NewRegistry(), p.log)
	claims.Start(p.ctx.Done())
	go nodes.RunWithContext(p.ctx)
	p.run(t, func(ctx context.Context) error { return vmis.Run(ctx, 2) }, func(ctx context.Context) error { return vms.Run(ctx, 2) })
}

// fakeNode is a Node without a kubelet: the test says whether it is Ready, and renews its Lease
// so that the node lifecycle controller takes what it says.
type fakeNode struct {
	name string
	// stopLease stops the Lease's renewals and waits for the last to end.
	stopLease func()
}

func startFakeNode(t *testing.T, name string) *fakeNode {
	t.Helper()
	ctx := context.Background()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi"), corev1.ResourcePods: resource.MustParse("110"),
		v1alpha1.DeviceKVM: resource.MustParse("100"), v1alpha1.DeviceTun: resource.MustParse("100"), v1alpha1.DeviceUserFaultFD: resource.MustParse("100"),
	}
	n, err := cluster.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name, v1alpha1.LabelKVMNode: "true"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n, err = cluster.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		n.Status.Capacity, n.Status.Allocatable = capacity, capacity
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		_, err = cluster.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	leaseCtx, stop := context.WithCancel(context.Background())
	leaseDone := make(chan struct{})
	go func() {
		defer close(leaseDone)
		leases := cluster.Kube.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		wait.UntilWithContext(leaseCtx, func(ctx context.Context) {
			l, err := leases.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				_, _ = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: time.Now()}}}, metav1.CreateOptions{})
				return
			}
			if err != nil {
				return
			}
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, _ = leases.Update(ctx, l, metav1.UpdateOptions{})
		}, 5*time.Second)
	}()
	stopLease := func() {
		stop()
		<-leaseDone
	}
	t.Cleanup(func() {
		stopLease()
		_ = cluster.Kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return &fakeNode{name: name, stopLease: stopLease}
}

// stopAnswering posts the node NotReady, as the node lifecycle controller does for a kubelet
// whose heartbeats stopped.
func (n *fakeNode) stopAnswering(t *testing.T) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := cluster.Kube.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
			Message: "Kubelet stopped posting node status.", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		_, err = cluster.Kube.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// taintOutOfService is what the admin does once the node is known to be off:
// kubectl taint node NAME node.kubernetes.io/out-of-service=nodeshutdown:NoExecute.
func (n *fakeNode) taintOutOfService(t *testing.T) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := cluster.Kube.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
		_, err = cluster.Kube.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func lostNodeVM(name string) *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: v1alpha1.RunStrategyAlways, Template: v1alpha1.VirtualMachineInstanceTemplateSpec{
			Spec: v1alpha1.VirtualMachineInstanceSpec{CPUs: 1, Memory: resource.MustParse("128Mi"),
				Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/guest-kernel:1", KernelPath: "/boot/vmlinuz"}, Cmdline: "console=ttyS0"}}}},
	}
}

// runningVMI waits for the VM's instance to be Scheduled on a node, plays that node's agent
// (Running, Ready) and returns it with its launcher pod.
func runningVMI(t *testing.T, ns, name string) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	var v *v1alpha1.VirtualMachineInstance
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		v, err = vmis.Get(ctx, name, metav1.GetOptions{})
		return err == nil && v.Status.Phase == v1alpha1.VMIScheduled && v.Status.NodeName != "", nil
	})
	if err != nil {
		pods, _ := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		var conditions []string
		for _, p := range pods.Items {
			conditions = append(conditions, fmt.Sprintf("%s: %+v", p.Name, p.Status.Conditions))
		}
		t.Fatalf("VMI %s/%s not Scheduled within a minute: %s %s; pods %s", ns, name, v.Status.Phase, v.Status.NodeName, conditions)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := vmis.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v.Status.Phase = v1alpha1.VMIRunning
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionReady, Status: metav1.ConditionTrue, Reason: "GuestRunning"})
		_, err = vmis.UpdateStatus(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, err = vmis.Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, v.Status.LauncherPod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return v, pod
}

// waitNodeLost waits for the VMI's NodeLost condition and the VM's WaitingForNode.
func waitNodeLost(t *testing.T, v *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	var last *v1alpha1.VirtualMachine
	var lastVMI *v1alpha1.VirtualMachineInstance
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		x, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		lastVMI = x
		if !meta.IsStatusConditionTrue(x.Status.Conditions, v1alpha1.VMIConditionNodeLost) {
			return false, nil
		}
		last, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		return err == nil && last.Status.PrintableStatus == v1alpha1.PrintableStatusWaitingForNode, nil
	})
	if err != nil {
		t.Fatalf("want the VMI's NodeLost condition and the VM WaitingForNode within 30s; VMI %+v, VM %+v", lastVMI.Status, last)
	}
	c := meta.FindStatusCondition(lastVMI.Status.Conditions, v1alpha1.VMIConditionNodeLost)
	t.Logf("NodeLost: %s", c.Message)
	for _, want := range []string{"node " + v.Status.NodeName + " is NotReady", vmi.OutOfServiceTaintCommand(v.Status.NodeName)} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the NodeLost message %q lacks %q", c.Message, want)
		}
	}
	kubewait.Event(t, cluster.Kube, v.Namespace, fields.Set{"involvedObject.name": v.Name, "reason": vmi.ReasonNodeLost}, 10*time.Second)
}

// stillWaiting checks, for window, that the VM's instance is the one it had, not ended, and
// that the VM was not restarted.
func stillWaiting(t *testing.T, v *v1alpha1.VirtualMachineInstance, window time.Duration, what string) {
	t.Helper()
	kubewait.Consistently(t, window, what, func(ctx context.Context) error {
		x, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading the VMI: %w", err)
		}
		if x.UID != v.UID || x.Status.Phase.Terminal() || x.DeletionTimestamp != nil {
			return fmt.Errorf("the VMI is %s (UID %s, deleting %v): %s", x.Status.Phase, x.UID, x.DeletionTimestamp != nil, x.Status.Message)
		}
		vm, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading the VM: %w", err)
		}
		if vm.Status.Restarts != 0 {
			return errors.New("the VM was restarted")
		}
		return nil
	})
}

// restartedElsewhere waits for the VM's next instance, Scheduled on another node than lost.
func restartedElsewhere(t *testing.T, old *v1alpha1.VirtualMachineInstance, lost string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var last *v1alpha1.VirtualMachineInstance
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		x, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(old.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = x
		return x.UID != old.UID && x.Status.NodeName != "", nil
	})
	if err != nil {
		t.Fatalf("want a new instance of VM %s on a node within 90s; last %+v", old.Name, last)
	}
	if last.Status.NodeName == lost {
		t.Errorf("the new instance was scheduled to the lost node %s", lost)
	}
	return last
}

// The frozen node's VM with RunStrategy Always: it waits while the node is NotReady, through the
// taint manager's deletion of its pod and a force deletion, and comes back on the other node
// once the node is tainted out of service.
func TestAVMOnALostNodeRestartsElsewhereOnlyAfterTheOutOfServiceTaint(t *testing.T) {
	startVMControllers(t)
	a, b := startFakeNode(t, "lost-node-a"), startFakeNode(t, "lost-node-b")
	nodes := map[string]*fakeNode{a.name: a, b.name: b}
	ns := cluster.Namespace(t, "lostnode-")
	ctx := context.Background()
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(ctx, lostNodeVM("vm"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, pod := runningVMI(t, ns, "vm")
	lost := nodes[v.Status.NodeName]
	t.Cleanup(func() { forceDeletePods(ns) })
	t.Logf("VMI %s runs on %s; the node stops answering", v.UID, lost.name)

	lost.stopAnswering(t)
	waitNodeLost(t, v)
	stillWaiting(t, v, 10*time.Second, "the VMI to wait on its NotReady node")

	// What the taint manager does after tolerationSeconds: a deletion no kubelet carries out.
	if err := cluster.Kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stillWaiting(t, v, 5*time.Second, "the VMI to wait while its pod is being deleted")
	// And what an admin may do: the pod is gone from the API, its guest not from the node.
	if err := cluster.Kube.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	stillWaiting(t, v, 10*time.Second, "a force-deleted launcher pod on a NotReady node not to count as the guest gone")

	lost.taintOutOfService(t)
	next := restartedElsewhere(t, v, lost.name)
	t.Logf("after the out-of-service taint the VM runs instance %s on %s", next.UID, next.Status.NodeName)
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": "vm", "involvedObject.kind": "VirtualMachine", "reason": vm.ReasonRestarting}, 10*time.Second)
	kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.uid": string(v.UID), "reason": vmi.ReasonNodeOutOfService}, 10*time.Second)
}

// With the out-of-service taint and the launcher pod left as it was, Kubernetes' taint eviction
// deletes the pod and its pod GC (or lifeboat's controller, which does not wait for it) removes
// it: the VM comes back elsewhere. Without the taint nothing is restarted for a while.
func TestALostNodesPodFlowsAwayOnlyWithTheOutOfServiceTaint(t *testing.T) {
	startVMControllers(t)
	a, b := startFakeNode(t, "lost-node-c"), startFakeNode(t, "lost-node-d")
	nodes := map[string]*fakeNode{a.name: a, b.name: b}
	ns := cluster.Namespace(t, "lostnode-")
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), lostNodeVM("vm"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v, pod := runningVMI(t, ns, "vm")
	lost := nodes[v.Status.NodeName]
	t.Cleanup(func() { forceDeletePods(ns) })
	// A pod of no VM on the same node: what Kubernetes alone does with it after the taint.
	bystander, err := cluster.Kube.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bystander"},
		Spec:       corev1.PodSpec{NodeName: lost.name, Containers: []corev1.Container{{Name: "c", Image: "example.org/bystander:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	lost.stopAnswering(t)
	waitNodeLost(t, v)
	stillWaiting(t, v, 15*time.Second, "nothing restarted while the node is only NotReady")

	lost.taintOutOfService(t)
	restartedElsewhere(t, v, lost.name)
	for _, p := range []*corev1.Pod{pod, bystander} {
		// Taint eviction deletes it, and pod GC (every 20 s) force-deletes a terminating pod on
		// a NotReady out-of-service node.
		err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("pod %s on the out-of-service node is still there after 90s", p.Name)
		}
	}
	if events, err := cluster.Kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"reason": vmi.ReasonForceDeleted}.String()}); err == nil {
		for _, e := range events.Items {
			t.Logf("%s: %s", e.Reason, e.Message)
		}
	}
}

// forceDeletePods removes the test's pods, which no kubelet ends.
func forceDeletePods(ns string) {
	ctx := context.Background()
	pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		_ = cluster.Kube.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
}
