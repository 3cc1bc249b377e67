package disruption

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func vmi(strategy v1alpha1.EvictionStrategy, migratable bool, mutate ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Spec.EvictionStrategy = ptr.To(strategy)
	v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, "node-a"
	c := metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"}
	if !migratable {
		c.Status, c.Reason = metav1.ConditionFalse, "LocalDisk"
	}
	v.Status.Conditions = []metav1.Condition{c}
	for _, m := range mutate {
		m(v)
	}
	return v
}

func pod(node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
}

// TestMinAvailable mirrors seed 000's third table ("Eviction Strategy | Is a PDB required"), then
// its note on migrations.
func TestMinAvailable(t *testing.T) {
	source := pod("node-a", corev1.PodRunning)
	target := pod("node-b", corev1.PodPending)
	cases := []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		pods []*corev1.Pod
		want int32
	}{
		{"None: no budget", vmi(v1alpha1.EvictionStrategyNone, true), []*corev1.Pod{source}, 0},
		{"LiveMigrate: a budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), []*corev1.Pod{source}, 1},
		{"LiveMigrate, even when not migratable: a budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, false), []*corev1.Pod{source}, 1},
		{"LiveMigrateIfPossible, migratable: a budget", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, true), []*corev1.Pod{source}, 1},
		{"LiveMigrateIfPossible, not migratable: no budget", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, false), []*corev1.Pod{source}, 0},
		{"External: a budget", vmi(v1alpha1.EvictionStrategyExternal, false), []*corev1.Pod{source}, 1},

		{"during a migration the target pod is protected too", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), []*corev1.Pod{source, target}, 2},
		{"after the migration, back to one: the source has ended", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.NodeName = "node-b" }),
			[]*corev1.Pod{pod("node-a", corev1.PodSucceeded), pod("node-b", corev1.PodRunning)}, 1},
		{"after a failed migration, back to one: the target has failed", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), []*corev1.Pod{source, pod("node-b", corev1.PodFailed)}, 1},
		{"before its pod exists, the budget is already there", vmi(v1alpha1.EvictionStrategyLiveMigrate, false, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase, v.Status.NodeName = v1alpha1.VMIPending, "" }), nil, 1},
		{"LiveMigrateIfPossible, not running yet: no budget", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMIScheduled }), []*corev1.Pod{source}, 0},
		{"the VM has ended: no budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMISucceeded }), []*corev1.Pod{source}, 0},
		{"the VMI is being deleted: no budget", vmi(v1alpha1.EvictionStrategyExternal, true, func(v *v1alpha1.VirtualMachineInstance) { v.DeletionTimestamp = ptr.To(metav1.Now()) }), []*corev1.Pod{source}, 0},
		{"the cluster's strategy applies when the VMI has none", func() *v1alpha1.VirtualMachineInstance {
			v := vmi(v1alpha1.EvictionStrategyNone, true)
			v.Spec.EvictionStrategy = nil
			return v
		}(), []*corev1.Pod{source}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := MinAvailable(tc.vmi, nil, tc.pods); got != tc.want {
				t.Errorf("minAvailable %d, want %d", got, tc.want)
			}
		})
	}
}

// TestEvictionInProgress: seed 003's annotation is on the source pod while the VM is marked.
func TestEvictionInProgress(t *testing.T) {
	marked := func(v *v1alpha1.VirtualMachineInstance) { v.Status.EvacuationNodeName = v.Status.NodeName }
	cases := []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		pod  *corev1.Pod
		want bool
	}{
		{"marked: the source pod carries it", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, marked), pod("node-a", corev1.PodRunning), true},
		{"marked: the target pod does not", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, marked), pod("node-b", corev1.PodPending), false},
		{"not marked: none", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), pod("node-a", corev1.PodRunning), false},
		{"a failed attempt while the mark stays: kept", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, marked, func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{Failed: true, SourceNode: "node-a", TargetNode: "node-b"}
		}), pod("node-a", corev1.PodRunning), true},
		{"after success the mark is gone and the VM runs elsewhere: removed from the old source", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.NodeName = "node-b"
		}), pod("node-a", corev1.PodSucceeded), false},
		{"a mark for another node (stale) does not count", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.EvacuationNodeName = "node-c"
		}), pod("node-a", corev1.PodRunning), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := EvictionInProgress(tc.vmi, tc.pod); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
