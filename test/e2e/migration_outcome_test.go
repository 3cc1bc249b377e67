package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// A migration's source pod deleted through the API (a drain, a pod deletion) is removed once its
// launcher exits, and the launcher exits as soon as its guest has left, before the source agent
// has recorded where the guest went. The controller must not take the pod's absence for the
// VM's loss (a make test run saw "LauncherPodVanished", then the VM lost with a guest that had
// arrived): the migration's outcome decides. The agents' writes are the test's, so the race
// that a loaded machine loses now and then is lost every time.
func TestASourcePodGoneBeforeTheMigrationsOutcomeLosesNothing(t *testing.T) {
	startController(t)
	ns := testNamespace(t)
	ctx := context.Background()
	v := createVMI(t, ns, newVMI("outcome", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	source := waitLauncherPod(t, v)
	const sourceNode, targetNode = "node-outcome-source", "node-outcome-target"
	target := launcherPodCopy(source, "target", targetNode)
	if _, err := cluster.Kube.CoreV1().Pods(ns).Create(ctx, target, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	// What the agents wrote: the guest runs on the source, a migration is under way, and the
	// target agent saw the guest arrive in its launcher.
	writeVMIStatus(t, v, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		s.Phase, s.NodeName = v1alpha1.VMIRunning, sourceNode
		s.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "m", MigrationUID: "m-uid",
			SourceNode: sourceNode, TargetNode: targetNode, StartTimestamp: &now, TargetNodeDomainReadyTimestamp: &now}
	})
	// The source pod, never scheduled here, is not on the VMI's node: for the controller it is
	// as gone as the kubelet's final removal of a deleted pod makes it.
	if err := cluster.Kube.CoreV1().Pods(ns).Delete(ctx, source.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	kubewait.Consistently(t, 3*time.Second, "the VMI Running while its migration's outcome is not recorded", func(ctx context.Context) error {
		got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.Phase != v1alpha1.VMIRunning {
			return fmt.Errorf("the controller made it %s: %s", got.Status.Phase, got.Status.Message)
		}
		return nil
	})
	// The source agent records the outcome: the VM runs on the target, and stays Running there.
	writeVMIStatus(t, v, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		s.NodeName = targetNode
		s.MigrationState.Completed, s.MigrationState.EndTimestamp = true, &now
	})
	kubewait.Consistently(t, 2*time.Second, "the VMI Running on the target with its target pod", func(ctx context.Context) error {
		got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, v.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.Phase != v1alpha1.VMIRunning || got.Status.NodeName != targetNode {
			return fmt.Errorf("phase %s on %q: %s", got.Status.Phase, got.Status.NodeName, got.Status.Message)
		}
		if _, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, target.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("the target pod: %w", err)
		}
		return nil
	})
	events, err := cluster.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + vmi.ReasonLauncherVanished})
	if err != nil || len(events.Items) != 0 {
		t.Errorf("want no %s Event for a VM that moved: %v, %d", vmi.ReasonLauncherVanished, err, len(events.Items))
	}
}

// waitLauncherPod waits for the controller to create v's launcher pod.
func waitLauncherPod(t *testing.T, v *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Kube.CoreV1().Pods(v.Namespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("the controller created no launcher pod for %s within 30 s", v.Name)
	}
	return pod
}

// launcherPodCopy is p as a migration's target pod named after suffix, bound to node.
func launcherPodCopy(p *corev1.Pod, suffix, node string) *corev1.Pod {
	c := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name + "-" + suffix, Namespace: p.Namespace, Labels: p.Labels,
		OwnerReferences: p.OwnerReferences}, Spec: *p.Spec.DeepCopy()}
	c.Spec.NodeName = node
	return c
}

func writeVMIStatus(t *testing.T, v *v1alpha1.VirtualMachineInstance, change func(*v1alpha1.VirtualMachineInstanceStatus)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(context.Background(), v.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(&got.Status)
		_, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).UpdateStatus(context.Background(), got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
