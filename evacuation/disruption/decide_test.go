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
	clusterDefault := func(s v1alpha1.EvictionStrategy) *v1alpha1.LifeboatConfig {
		return &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{EvictionStrategy: ptr.To(s)}}
	}
	noTarget := func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.Conditions[0].Status, v.Status.Conditions[0].Reason = metav1.ConditionFalse, v1alpha1.VMIReasonNoTargetNode
	}
	noStrategy := func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = nil }
	cases := []struct {
		name      string
		vmi       *v1alpha1.VirtualMachineInstance
		config    *v1alpha1.LifeboatConfig
		pods      []*corev1.Pod
		migrating bool
		want      int32
	}{
		{"None: no budget", vmi(v1alpha1.EvictionStrategyNone, true), nil, []*corev1.Pod{source}, false, 0},
		{"LiveMigrate: a budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), nil, []*corev1.Pod{source}, false, 1},
		{"LiveMigrate, even when not migratable: a budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, false), nil, []*corev1.Pod{source}, false, 1},
		{"LiveMigrateIfPossible, migratable: a budget", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, true), nil, []*corev1.Pod{source}, false, 1},
		{"LiveMigrateIfPossible, not migratable: no budget", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, false), nil, []*corev1.Pod{source}, false, 0},
		{"LiveMigrateIfPossible, no node can take it (NoTargetNode): no budget, so a drain evicts it as None", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, true, noTarget), nil, []*corev1.Pod{source}, false, 0},
		{"LiveMigrate, no node can take it (NoTargetNode): a budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, noTarget), nil, []*corev1.Pod{source}, false, 1},
		{"External: a budget", vmi(v1alpha1.EvictionStrategyExternal, false), nil, []*corev1.Pod{source}, false, 1},
		{"no strategy, the cluster's default LiveMigrate: a budget", vmi(v1alpha1.EvictionStrategyNone, true, noStrategy), clusterDefault(v1alpha1.EvictionStrategyLiveMigrate), []*corev1.Pod{source}, false, 1},
		{"no strategy, the cluster's default None: no budget", vmi(v1alpha1.EvictionStrategyNone, true, noStrategy), clusterDefault(v1alpha1.EvictionStrategyNone), []*corev1.Pod{source}, false, 0},
		{"no strategy and no LifeboatConfig: None, no budget", vmi(v1alpha1.EvictionStrategyNone, true, noStrategy), nil, []*corev1.Pod{source}, false, 0},
		{"the VMI's own strategy wins over the cluster's", vmi(v1alpha1.EvictionStrategyNone, true), clusterDefault(v1alpha1.EvictionStrategyLiveMigrate), []*corev1.Pod{source}, false, 0},

		{"a migration begins: the budget covers its target pod before the pod exists", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), nil, []*corev1.Pod{source}, true, 2},
		{"during a migration the target pod is protected too", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), nil, []*corev1.Pod{source, target}, true, 2},
		{"a migration of a VM that needs no budget makes none", vmi(v1alpha1.EvictionStrategyNone, true), nil, []*corev1.Pod{source}, true, 0},
		{"after the migration, back to one: the source has ended", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.NodeName = "node-b" }),
			nil, []*corev1.Pod{pod("node-a", corev1.PodSucceeded), pod("node-b", corev1.PodRunning)}, false, 1},
		{"after a failed migration, back to one: the target has failed", vmi(v1alpha1.EvictionStrategyLiveMigrate, true), nil, []*corev1.Pod{source, pod("node-b", corev1.PodFailed)}, false, 1},
		{"before its pod exists, the budget is already there", vmi(v1alpha1.EvictionStrategyLiveMigrate, false, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase, v.Status.NodeName = v1alpha1.VMIPending, "" }), nil, nil, false, 1},
		{"LiveMigrateIfPossible, not running yet: no budget", vmi(v1alpha1.EvictionStrategyLiveMigrateIfPossible, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMIScheduled }), nil, []*corev1.Pod{source}, false, 0},
		{"the VM has ended: no budget", vmi(v1alpha1.EvictionStrategyLiveMigrate, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMISucceeded }), nil, []*corev1.Pod{source}, false, 0},
		{"the VMI is being deleted: no budget", vmi(v1alpha1.EvictionStrategyExternal, true, func(v *v1alpha1.VirtualMachineInstance) { v.DeletionTimestamp = ptr.To(metav1.Now()) }), nil, []*corev1.Pod{source}, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := MinAvailable(tc.vmi, tc.config, tc.pods, tc.migrating); got != tc.want {
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
