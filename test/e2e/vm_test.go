package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

const bootTimeout = 2 * time.Minute

// TestVMLifecycle: a VMI runs a real guest on one of two nodes; deleting it shuts the guest down
// through ACPI and removes its pod.
func TestVMLifecycle(t *testing.T) {
	startController(t)
	nodes := startNodes(t, 2)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("lifecycle"))

	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	n := nodeOf(t, nodes, vmi)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, n.consolePath(vmi), protocol.Ready); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("a running VMI must be Ready: %s", describe(vmi))
	}
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("a kernel-booted VMI without disks is live-migratable: %s", describe(vmi))
	}
	pod := launcherPod(t, vmi)
	for _, reason := range []string{"SuccessfulCreate", "Scheduled", "Started"} {
		waitEvent(t, ns, vmi.Name, reason, 10*time.Second)
	}

	if err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Delete(context.Background(), vmi.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := guest.WaitForLine(ctx, n.consolePath(vmi), protocol.PowerButton); err != nil {
		t.Fatalf("the guest was not shut down through its power button: %v", err)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, podErr := cluster.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		_, vmiErr := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, vmi.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(podErr) && apierrors.IsNotFound(vmiErr), nil
	})
	if err != nil {
		t.Fatalf("after the guest shut down, its launcher pod and the VMI must be gone: %v", err)
	}
	// The pod's files on the node go with it (its run volume), and so does the agent's link to them.
	dir := filepath.Dir(n.consolePath(vmi))
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Lstat(dir)
		return errors.Is(err, os.ErrNotExist), nil
	})
	if err != nil {
		t.Fatalf("the launcher directory %s of the deleted pod is still on node %s: %v", dir, n.Name(), err)
	}
}

// TestKilledLauncherFailsTheVMI: a launcher that dies under its guest makes the VMI Failed, with a reason.
func TestKilledLauncherFailsTheVMI(t *testing.T) {
	startController(t)
	startNodes(t, 1)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("killed"))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)

	pid := launcherPID(t, launcherPod(t, vmi))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	vmi = waitVMI(t, ns, vmi.Name, time.Minute, "phase Failed", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMIFailed
	})
	if vmi.Status.Reason == "" || !strings.Contains(vmi.Status.Message, "137") {
		t.Errorf("want a reason and a message with the launcher's exit code 137: %s", describe(vmi))
	}
	waitEvent(t, ns, vmi.Name, "LauncherFailed", 10*time.Second)
}

// TestAgentRestartLeavesTheGuestRunning: the agent can crash and come back; the guest never notices,
// and the new agent takes the domain over (it can still shut it down).
func TestAgentRestartLeavesTheGuestRunning(t *testing.T) {
	startController(t)
	nodes := startNodes(t, 1)
	n := nodes[0]
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("agent-restart"))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	before := waitCounterPast(t, n.consolePath(vmi), 0, bootTimeout)

	n.agent.Kill()
	after := waitCounterPast(t, n.consolePath(vmi), before+2, 30*time.Second)
	n.agent.start(t)
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return n.metric(t, "lifeboat_agent_launchers") == 1, nil
	})
	if err != nil {
		t.Fatalf("the restarted agent did not reconnect to the running launcher (lifeboat_agent_launchers = %v)", n.metric(t, "lifeboat_agent_launchers"))
	}
	waitCounterPast(t, n.consolePath(vmi), after+2, 30*time.Second)
	if v := waitVMI(t, ns, vmi.Name, 5*time.Second, "still Running", running); v.Status.NodeName != n.Name() {
		t.Errorf("VMI moved: %s", describe(v))
	}

	if err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Delete(context.Background(), vmi.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, n.consolePath(vmi), protocol.PowerButton); err != nil {
		t.Fatalf("the restarted agent did not shut the guest down: %v", err)
	}
}

// TestTooBigVMIStaysScheduling: a VMI no node can hold waits, and says why.
func TestTooBigVMIStaysScheduling(t *testing.T) {
	startController(t)
	startNodes(t, 1)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("too-big", func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Memory = resource.MustParse("64Gi") }))
	// A new node carries the not-ready taint for a moment; the scheduler's answer after that says why.
	var messages []string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cluster.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + vmi.Name + ",reason=FailedScheduling"})
		if err != nil {
			return false, nil
		}
		messages = messages[:0]
		for _, e := range evs.Items {
			messages = append(messages, e.Message)
			if strings.Contains(e.Message, "Insufficient memory") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("want a FailedScheduling event on the VMI saying Insufficient memory; got %q", messages)
	}
	if v := waitVMI(t, ns, vmi.Name, 5*time.Second, "phase Scheduling", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMIScheduling
	}); v.Status.NodeName != "" {
		t.Errorf("an unscheduled VMI has no node: %s", describe(v))
	}
}
