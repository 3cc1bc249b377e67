package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A user deletes a LiveMigrate VM's launcher pod with a 40 s grace period (kubectl delete pod
// --grace-period=40): the SIGTERM that follows is not node pressure. The VM is marked with cause
// PodDeleted and the deadline the API server set (the pod's deletionTimestamp), not the kubelet's
// evictionMaxPodGracePeriod (12 s on these nodes), and it moves within it.
func TestADeletedPodIsReadForWhatItIs(t *testing.T) {
	const grace = 40
	setConfig(t, true)
	source, vmi := runningVM(t, "deleted", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
	})
	startNodes(t, 1)
	pod := launcherPod(t, vmi)
	ctx := context.Background()
	if err := cluster.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](grace)}); err != nil {
		t.Fatal(err)
	}
	deleting, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || deleting.DeletionTimestamp == nil {
		t.Fatalf("the deleted pod %s: %v, deletionTimestamp %v", pod.Name, err, deleting.DeletionTimestamp)
	}
	m := waitMigrationOf(t, vmi, "caused by the pod's deletion", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Cause != ""
	})
	if m.Status.Cause != v1alpha1.MigrationCausePodDeleted {
		t.Errorf("the migration's cause is %s, want %s", m.Status.Cause, v1alpha1.MigrationCausePodDeleted)
	}
	if d := m.Status.Deadline; d == nil || d.Sub(deleting.DeletionTimestamp.Time).Abs() > time.Second {
		t.Errorf("the migration's deadline is %v, want the pod's deletionTimestamp %s", d, deleting.DeletionTimestamp)
	}
	moved := waitVMI(t, vmi.Namespace, vmi.Name, grace*time.Second, "running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName != "" && v.Status.NodeName != source.Name()
	})
	if s := moved.Status.MigrationState; s == nil || !s.Completed || s.Cause != v1alpha1.MigrationCausePodDeleted {
		t.Errorf("the VM moved, by a completed migration with cause PodDeleted: %s", describe(moved))
	}
}
