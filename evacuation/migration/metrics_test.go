package migration

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func migrationIn(name string, cause v1alpha1.MigrationCause, phase v1alpha1.VirtualMachineInstanceMigrationPhase, deadline *metav1.Time) *v1alpha1.VirtualMachineInstanceMigration {
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: name},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm-" + name}}
	m.Status.Cause, m.Status.Phase, m.Status.Deadline, m.Status.SourceNode = cause, phase, deadline, "node-a"
	return m
}

// madeAhead records m as an evacuation's migration made ahead of a free slot.
func madeAhead(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: "uid-" + m.Name, WaitingForSlot: true}
	return m
}

func TestMigrationsAreCountedByCauseAndPhaseWithTheDeadlinesOfThoseUnderWay(t *testing.T) {
	deadline := metav1.NewTime(time.Unix(1_800_000_000, 0))
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, m := range []*v1alpha1.VirtualMachineInstanceMigration{
		migrationIn("running", v1alpha1.MigrationCauseNodePressure, v1alpha1.MigrationRunning, &deadline),
		migrationIn("pending", v1alpha1.MigrationCauseNodePressure, v1alpha1.MigrationPending, &deadline),
		migrationIn("drain", v1alpha1.MigrationCauseDrain, v1alpha1.MigrationRunning, nil),
		migrationIn("done", v1alpha1.MigrationCauseNodePressure, v1alpha1.MigrationSucceeded, &deadline),
		madeAhead(migrationIn("ahead", v1alpha1.MigrationCauseDrain, v1alpha1.MigrationTargetReady, nil)),
	} {
		if err := indexer.Add(m); err != nil {
			t.Fatal(err)
		}
	}
	c := cacheCollector{migrations: lifeboatlisters.NewVirtualMachineInstanceMigrationLister(indexer)}
	want := `
# HELP lifeboat_migration_deadline_timestamp_seconds When each migration that has not ended must have moved its guest off its source node (Unix time); migrations without a deadline are not listed.
# TYPE lifeboat_migration_deadline_timestamp_seconds gauge
lifeboat_migration_deadline_timestamp_seconds{cause="NodePressure",migration="pending",namespace="vms",source_node="node-a",vmi="vm-pending"} 1.8e+09
lifeboat_migration_deadline_timestamp_seconds{cause="NodePressure",migration="running",namespace="vms",source_node="node-a",vmi="vm-running"} 1.8e+09
# HELP lifeboat_migrations Migrations that exist, by cause and phase (Succeeded and Failed ones until they are deleted).
# TYPE lifeboat_migrations gauge
lifeboat_migrations{cause="Drain",phase="Running"} 1
lifeboat_migrations{cause="Drain",phase="TargetReady"} 1
lifeboat_migrations{cause="NodePressure",phase="Pending"} 1
lifeboat_migrations{cause="NodePressure",phase="Running"} 1
lifeboat_migrations{cause="NodePressure",phase="Succeeded"} 1
# HELP lifeboat_migrations_waiting_for_slot Evacuation migrations made ahead of a free parallel-migration slot that wait for one, by source node: their targets are prepared, their memory not moving yet.
# TYPE lifeboat_migrations_waiting_for_slot gauge
lifeboat_migrations_waiting_for_slot{source_node="node-a"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestAMigrationIsCountedOnceWhenItEnds(t *testing.T) {
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ended"}, []string{"cause", "phase"})
	h := countEnded(ended)
	running := migrationIn("m", v1alpha1.MigrationCauseDrain, v1alpha1.MigrationRunning, nil)
	failed := migrationIn("m", v1alpha1.MigrationCauseDrain, v1alpha1.MigrationFailed, nil)
	h.OnUpdate(running, running)
	h.OnUpdate(running, failed)
	h.OnUpdate(failed, failed) // a resync of the ended migration
	if got := testutil.ToFloat64(ended.WithLabelValues("Drain", "Failed")); got != 1 {
		t.Errorf("failed drain migrations counted %v times, want 1", got)
	}
	if got := testutil.CollectAndCount(ended); got != 1 {
		t.Errorf("%d series, want only the failed drain", got)
	}
}

func TestNoTargetCollector(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	vmi := func(name, node string, reason string) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, node
		status := metav1.ConditionFalse
		if reason == v1alpha1.VMIReasonMigratable {
			status = metav1.ConditionTrue
		}
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: status, Reason: reason}}
		return v
	}
	for _, v := range []*v1alpha1.VirtualMachineInstance{vmi("a", "n1", v1alpha1.VMIReasonNoTargetNode), vmi("b", "n1", v1alpha1.VMIReasonNoTargetNode),
		vmi("c", "n2", v1alpha1.VMIReasonNoTargetNode), vmi("d", "n2", v1alpha1.VMIReasonMigratable), vmi("e", "n2", "LocalDisk")} {
		_ = indexer.Add(v)
	}
	want := `
# HELP lifeboat_vmis_no_target_node Running VMIs that no node other than their own could take (LiveMigratable False, reason NoTargetNode), by node: they cannot live-migrate, and a drain of the node waits for them (LiveMigrate) or shuts them down (LiveMigrateIfPossible).
# TYPE lifeboat_vmis_no_target_node gauge
lifeboat_vmis_no_target_node{node="n1"} 2
lifeboat_vmis_no_target_node{node="n2"} 1
`
	if err := testutil.CollectAndCompare(noTargetCollector{vmis: lifeboatlisters.NewVirtualMachineInstanceLister(indexer)}, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
