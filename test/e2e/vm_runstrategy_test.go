package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/test/evictionrequest"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

func newVM(name string, strategy v1alpha1.RunStrategy) *v1alpha1.VirtualMachine {
	template := newVMI(name)
	return &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: strategy, Template: v1alpha1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: v1alpha1.TemplateMeta{Labels: map[string]string{"app": name}}, Spec: template.Spec}},
	}
}

func waitVM(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*v1alpha1.VirtualMachine) bool) *v1alpha1.VirtualMachine {
	t.Helper()
	return kubewait.For(t, timeout, fmt.Sprintf("VM %s/%s: %s", ns, name, what), func(ctx context.Context) (*v1alpha1.VirtualMachine, error) {
		return cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Get(ctx, name, metav1.GetOptions{})
	}, cond, func(v *v1alpha1.VirtualMachine) string { return fmt.Sprintf("%+v", v.Status) })
}

// Seed 000's None row: a None VM whose pod its node evicts is shut down, and then its run
// strategy decides: Always starts it again, RerunOnFailure and Once leave it stopped, since its
// guest shut down cleanly.
func TestEvictedNoneVMFollowsItsRunStrategy(t *testing.T) {
	startController(t)
	nodes := startNodes(t, 2)
	ns := testNamespace(t)
	strategies := map[string]v1alpha1.RunStrategy{"always": v1alpha1.RunStrategyAlways, "rerun": v1alpha1.RunStrategyRerunOnFailure, "once": v1alpha1.RunStrategyOnce}
	first := map[string]*v1alpha1.VirtualMachineInstance{}
	for name, s := range strategies {
		vm := newVM(name, s)
		allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating VM %s: %v", name, err)
		}
	}
	for name := range strategies {
		waitVM(t, ns, name, bootTimeout, "Running and Ready", func(v *v1alpha1.VirtualMachine) bool {
			return v.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && v.Status.Ready && v.Status.InstanceName == name
		})
		vmi := waitVMI(t, ns, name, bootTimeout, "Running", running)
		if ref := metav1.GetControllerOf(vmi); ref == nil || ref.Kind != "VirtualMachine" || ref.Name != name {
			t.Errorf("VMI %s is controlled by %+v, want VirtualMachine %s", name, ref, name)
		}
		first[name] = vmi
		waitCounterPast(t, nodeOf(t, nodes, vmi).consolePath(vmi), 1, bootTimeout)
		evict(t, nodeOf(t, nodes, vmi), vmi)
	}

	// Always: a new instance, the restart counted and explained on the VM.
	again := waitVMI(t, ns, "always", 2*bootTimeout, "a new instance running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID != first["always"].UID && running(v)
	})
	vm := waitVM(t, ns, "always", bootTimeout, "Running again with one restart", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && v.Status.Restarts == 1
	})
	waitEvent(t, ns, vm.Name, "Restarting", 30*time.Second)
	t.Logf("VM always: instance %s ended, %s runs on %s", first["always"].UID, again.UID, again.Status.NodeName)

	// RerunOnFailure and Once: stopped, their instance ended and not made again.
	for _, name := range []string{"rerun", "once"} {
		v := waitVM(t, ns, name, 2*bootTimeout, "Stopped", func(v *v1alpha1.VirtualMachine) bool {
			return v.Status.PrintableStatus == v1alpha1.PrintableStatusStopped
		})
		vmi, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || vmi.UID != first[name].UID || vmi.Status.Phase != v1alpha1.VMISucceeded || v.Status.Restarts != 0 {
			t.Errorf("VM %s (%s): instance %v (%v), restarts %d; want the first instance, Succeeded, never restarted", name, v.Spec.RunStrategy, vmi, err, v.Status.Restarts)
		}
	}
}

// Halted stops a running VM gracefully; deleting a VM waits, with its finalizer, until its
// instance is gone.
func TestHaltingAndDeletingAVM(t *testing.T) {
	startController(t)
	startNodes(t, 1)
	ns := testNamespace(t)
	vms := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns)
	vm := newVM("halted", v1alpha1.RunStrategyHalted)
	allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
	if _, err := vms.Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitVM(t, ns, vm.Name, 30*time.Second, "Stopped without an instance", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusStopped && v.Status.InstanceName == ""
	})
	setStrategy := func(s v1alpha1.RunStrategy) {
		t.Helper()
		patch := []byte(`{"spec":{"runStrategy":"` + string(s) + `"}}`)
		if _, err := vms.Patch(context.Background(), vm.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setStrategy(v1alpha1.RunStrategyAlways)
	waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	setStrategy(v1alpha1.RunStrategyHalted)
	waitEvent(t, ns, vm.Name, "Stopping", 30*time.Second)
	waitVM(t, ns, vm.Name, time.Minute, "Stopped, its instance gone", func(v *v1alpha1.VirtualMachine) bool {
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), vm.Name, metav1.GetOptions{})
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusStopped && apierrors.IsNotFound(err)
	})

	setStrategy(v1alpha1.RunStrategyAlways)
	vmi := waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	if err := vms.Delete(context.Background(), vm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The VM stays while its instance shuts down, then both go.
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, vmErr := vms.Get(ctx, vm.Name, metav1.GetOptions{})
		got, vmiErr := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, vm.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(vmErr) && !apierrors.IsNotFound(vmiErr) && got.UID == vmi.UID {
			t.Errorf("the VM went before its instance %s", vmi.UID)
			return true, nil
		}
		return apierrors.IsNotFound(vmErr) && apierrors.IsNotFound(vmiErr), nil
	})
	if err != nil {
		t.Fatalf("the deleted VM and its instance did not go: %v", err)
	}
}

// Seed 000's None row through the eviction API, as a drain makes it: the eviction proceeds, the
// guest shuts down, and Always starts the VM again, on another node, since its node is cordoned.
func TestDrainedNoneVMStartsAgainOnAnotherNode(t *testing.T) {
	setConfig(t, false)
	startControllerWithWebhook(t)
	startNodes(t, 2)
	ns := testNamespace(t)
	vm := newVM("drained", v1alpha1.RunStrategyAlways)
	allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	setUnschedulable(t, first.Status.NodeName, true)
	t.Cleanup(func() { setUnschedulable(t, first.Status.NodeName, false) })
	if code, msg := evictPod(t, launcherPod(t, first), false); code != 201 {
		t.Fatalf("evicting the None VM's pod: %d %s; want it granted (seed 000: None lets the eviction proceed)", code, msg)
	}
	again := waitVMI(t, ns, vm.Name, 2*bootTimeout, "a new instance running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID != first.UID && running(v)
	})
	if again.Status.NodeName == first.Status.NodeName {
		t.Errorf("the VM started again on its cordoned node %s", again.Status.NodeName)
	}
	waitVM(t, ns, vm.Name, 30*time.Second, "Running with one restart", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && v.Status.Restarts == 1
	})
}

// An Always VM whose controller is killed as its instance is evicted, and started again once the
// instance has ended, is restarted once: one new instance, one restart counted, and never two
// instances at once.
func TestAControllerKilledMidRestartRestartsTheVMOnce(t *testing.T) {
	controller := startController(t)
	nodes := startNodes(t, 1)
	ns := testNamespace(t)
	vm := newVM("restarted", v1alpha1.RunStrategyAlways)
	allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	waitCounterPast(t, nodes[0].consolePath(first), 1, bootTimeout)

	// Every instance the VM ever has, as the API server reports them.
	w, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// The controller dies as the node evicts the VM: the instance ends while no controller runs,
	// and the one that starts finds the VM to restart.
	controller.Kill()
	if err := evict(t, nodes[0], first)(); err != nil {
		t.Fatalf("the first instance's launcher pod did not end: %v", err)
	}
	controller.start(t)

	again := waitVMI(t, ns, vm.Name, 2*bootTimeout, "a new instance running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID != first.UID && running(v)
	})
	v := waitVM(t, ns, vm.Name, bootTimeout, "Running with one restart", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && v.Status.Restarts == 1
	})
	// The watch saw exactly two instances, and the second only once the first was gone.
	seen, firstGone := map[types.UID]bool{}, false
	for !seen[again.UID] {
		select {
		case e := <-w.ResultChan():
			vmi, ok := e.Object.(*v1alpha1.VirtualMachineInstance)
			if !ok {
				continue
			}
			if e.Type == watch.Deleted && vmi.UID == first.UID {
				firstGone = true
			}
			if vmi.UID != first.UID && !seen[vmi.UID] && !firstGone {
				t.Errorf("instance %s appeared while the first, %s, was still there", vmi.UID, first.UID)
			}
			seen[vmi.UID] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("the watch did not report instance %s within 10s", again.UID)
		}
	}
	delete(seen, first.UID)
	if len(seen) != 1 || v.Status.InstanceName != vm.Name {
		t.Errorf("instances after the first: %v, want only %s; VM status %+v", seen, again.UID, v.Status)
	}
}

// Seed 000's None row through the EvictionRequest API: lifeboat, the pod's first responder,
// declines (it does not move None VMs) and completes at once, naming the next step; the
// evictionrequest controller's imperative eviction then evicts the pod, the guest shuts down,
// and Always starts the VM again, on another node, since its node is cordoned.
func TestEvictionRequestedNoneVMStartsAgainOnAnotherNode(t *testing.T) {
	setConfig(t, false)
	startControllerWithWebhook(t)
	startNodes(t, 2)
	ns := testNamespace(t)
	vm := newVM("requested", v1alpha1.RunStrategyAlways)
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	setUnschedulable(t, first.Status.NodeName, true)
	t.Cleanup(func() { setUnschedulable(t, first.Status.NodeName, false) })

	ctx := context.Background()
	pod := launcherPod(t, first)
	erc, err := evictionrequest.Request(ctx, cluster.Kube, pod, requester)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := erc.Wait(ctx, time.Minute, "lifeboat's completionTime", func(ev *lifecyclev1alpha1.Eviction) bool { return responder.Entry(ev).CompletionTime != nil })
	if err != nil {
		t.Fatal(err)
	}
	if msg := ptr.Deref(responder.Entry(ev).Message, ""); !strings.Contains(msg, "eviction strategy None") || !strings.Contains(msg, "the next responder evicts pod "+pod.Name) {
		t.Errorf("lifeboat's completion message %q: want it to say it does not move a None VM and what comes next", msg)
	}
	expectNoMigrations(t, ns, "a None VM is never migrated")
	next, err := erc.Advance(ctx)
	if err != nil || next != lifecyclev1alpha1.EvictionResponderImperativeEviction {
		t.Fatalf("after lifeboat completed, the next responder must be the imperative eviction: %q, %v", next, err)
	}
	// The imperative eviction is the eviction API, which the evictionrequest controller calls.
	if code, msg := evictPod(t, pod, false); code != 201 {
		t.Fatalf("the imperative eviction of the None VM's pod: %d %s; want it granted", code, msg)
	}
	again := waitVMI(t, ns, vm.Name, 2*bootTimeout, "a new instance running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID != first.UID && running(v)
	})
	if again.Status.NodeName == first.Status.NodeName {
		t.Errorf("the VM started again on its cordoned node %s", again.Status.NodeName)
	}
	waitVM(t, ns, vm.Name, 30*time.Second, "Running with one restart", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && v.Status.Restarts == 1
	})
}
