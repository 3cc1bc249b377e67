package evacuate

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

var now = time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC)

type vmiOpt func(*v1alpha1.VirtualMachineInstance)

// markedVMI is a running, live-migratable VMI on node marked for cause, deadline seconds from now (0: none).
func markedVMI(name, node string, cause string, deadline int, opts ...vmiOpt) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
	v.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	v.Status.Phase, v.Status.NodeName, v.Status.EvacuationNodeName = v1alpha1.VMIRunning, node, node
	if deadline != 0 {
		v.Status.EvacuationDeadline = ptr.To(metav1.NewTime(now.Add(time.Duration(deadline) * time.Second)))
	}
	v.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"},
		{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue, Reason: cause, LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))},
	}
	for _, o := range opts {
		o(v)
	}
	return v
}

func withStrategy(s v1alpha1.EvictionStrategy) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = ptr.To(s) }
}

func notMigratable(v *v1alpha1.VirtualMachineInstance) {
	v.Status.Conditions[0].Status, v.Status.Conditions[0].Reason = metav1.ConditionFalse, "LocalDisk"
}

func unmarked(v *v1alpha1.VirtualMachineInstance) { v.Status.EvacuationNodeName = "" }

// migration is an evacuation migration of vmi (in namespace ns), recorded as this controller's.
func migration(vmi, source string, phase v1alpha1.VirtualMachineInstanceMigrationPhase, endedAgo time.Duration) *v1alpha1.VirtualMachineInstanceMigration {
	m := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: vmi + "-mig", UID: types.UID(vmi + "-mig-uid"),
			Labels: map[string]string{v1alpha1.LabelVMIUID: "uid-" + vmi, v1alpha1.LabelEvacuation: "true"}},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
		Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase, SourceNode: source,
			Evacuation: &v1alpha1.MigrationEvacuation{VMIUID: "uid-" + vmi}},
	}
	if endedAgo != 0 {
		m.Status.EndTimestamp = ptr.To(metav1.NewTime(now.Add(-endedAgo)))
	}
	return m
}

// targetOn is m with its target on node.
func targetOn(node string, m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Status.TargetNode = node
	return m
}

// manual is a person's migration in namespace ns: the same labels, but no record of the
// controller's (a tenant may set any label).
func manual(ns, name string, m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Namespace, m.Name, m.UID, m.Status.Evacuation = ns, name, types.UID(ns+"-"+name), nil
	return m
}

// forged is a tenant's migration of a VMI that does not exist, failed at once, carrying the
// labels of the evacuation migrations of the VMI whose UID is victim.
func forged(name, victim string, endedAgo time.Duration) *v1alpha1.VirtualMachineInstanceMigration {
	m := manual("tenant", name, migration("gone", "", v1alpha1.MigrationFailed, endedAgo))
	m.Labels[v1alpha1.LabelVMIUID] = victim
	return m
}

// tenantsStuck are five of a tenant's migrations of its own VMI that wait for a target forever.
func tenantsStuck() []*v1alpha1.VirtualMachineInstanceMigration {
	var ms []*v1alpha1.VirtualMachineInstanceMigration
	for i := range 5 {
		ms = append(ms, manual("tenant", fmt.Sprintf("stuck-%d", i), migration("own", "n1", v1alpha1.MigrationScheduling, 0)))
	}
	return ms
}

func unschedulable(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Status.TargetUnschedulable = true
	return m
}

// madeAhead marks an evacuation migration as made ahead of a free slot.
func madeAhead(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Status.Evacuation.WaitingForSlot = true
	return m
}

// following is m, made ahead, taking the slot of the migration with UID after when it ends.
func following(after string, m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Status.Evacuation.SlotAfterUID = after
	return m
}

// startedAgo is m, under way, started ago before now.
func startedAgo(ago time.Duration, m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m.Status.StartTimestamp = ptr.To(metav1.NewTime(now.Add(-ago)))
	return m
}

func config(perCluster, perNode int32) *v1alpha1.LifeboatConfig {
	return &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{Migrations: v1alpha1.MigrationsConfig{
		ParallelMigrationsPerCluster: ptr.To(perCluster), ParallelOutboundMigrationsPerNode: ptr.To(perNode),
	}}}
}

func TestPlan(t *testing.T) {
	cases := []struct {
		name       string
		vmis       []*v1alpha1.VirtualMachineInstance
		migrations []*v1alpha1.VirtualMachineInstanceMigration
		config     *v1alpha1.LifeboatConfig
		want       []string // "name:cause", in order
		external   []string
		retryAfter time.Duration
		// capacityChanged is how long ago a node or pod last made room; 0: never.
		capacityChanged time.Duration
		awaiting        []string
		// prepare are the candidates made ahead ("name:cause"); release and withdraw the
		// migrations made ahead that get a slot or go.
		prepare, release, withdraw []string
		// follow are the migrations made ahead that follow one under way ("follower>followed").
		follow []string
	}{
		{name: "a marked LiveMigrate VMI gets a migration with its cause",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 30)}, want: []string{"a:NodePressure"}},
		{name: "unmarked VMIs are left alone",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 30, unmarked)}},
		{name: "already migrating: no second migration",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 30)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n1", v1alpha1.MigrationRunning, 0)}},
		{name: "the VMI records an unfinished migration: none more",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 30, func(v *v1alpha1.VirtualMachineInstance) {
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "a-mig", MigrationUID: "a-mig-uid"}
			})}},
		{name: "the VMI's record is open but its migration failed (its source agent was down): retried",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 60, func(v *v1alpha1.VirtualMachineInstance) {
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "a-mig", MigrationUID: "a-mig-uid"}
			})},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n1", v1alpha1.MigrationFailed, 6*time.Second)},
			want:       []string{"a:NodePressure"}},
		{name: "the migration reads succeeded but the VMI's copy is behind, still marked on the node it left: none more",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 60, func(v *v1alpha1.VirtualMachineInstance) {
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "a-mig", MigrationUID: "a-mig-uid"}
			})},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n1", v1alpha1.MigrationSucceeded, 6*time.Second)}},
		{name: "External: left to the external controller",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "APIEviction", 0, withStrategy(v1alpha1.EvictionStrategyExternal))}, external: []string{"a"}},
		{name: "None: never migrated",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "APIEviction", 0, withStrategy(v1alpha1.EvictionStrategyNone))}},
		{name: "LiveMigrateIfPossible: only when migratable",
			vmis: []*v1alpha1.VirtualMachineInstance{
				markedVMI("a", "n1", "Drain", 0, withStrategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible)),
				markedVMI("b", "n1", "Drain", 0, withStrategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible), notMigratable),
			}, want: []string{"a:Drain"}},
		{name: "earliest deadline first, then node pressure before relief before drains before the rest",
			vmis: []*v1alpha1.VirtualMachineInstance{
				markedVMI("api", "n1", "APIEviction", 0), markedVMI("drain", "n2", "Drain", 0), markedVMI("relief", "n5", "NodePressureRelief", 0),
				markedVMI("late", "n3", "NodePressure", 90), markedVMI("soon", "n4", "NodePressure", 20),
			}, want: []string{"soon:NodePressure", "late:NodePressure", "relief:NodePressureRelief", "drain:Drain", "api:APIEviction"}},
		{name: "at most parallelOutboundMigrationsPerNode leave one node",
			vmis: []*v1alpha1.VirtualMachineInstance{
				markedVMI("a", "n1", "NodePressure", 10), markedVMI("b", "n1", "NodePressure", 20), markedVMI("c", "n1", "NodePressure", 30), markedVMI("d", "n2", "NodePressure", 40),
			}, config: config(5, 2), want: []string{"a:NodePressure", "b:NodePressure", "d:NodePressure"}},
		{name: "running migrations count against the limits",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 10), markedVMI("b", "n2", "NodePressure", 20)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("x", "n1", v1alpha1.MigrationRunning, 0), migration("y", "n3", v1alpha1.MigrationScheduling, 0)},
			config:     config(3, 1), want: []string{"b:NodePressure"}, prepare: []string{"a:NodePressure"}},
		{name: "a migration not picked up yet counts against the node its VMI runs on",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0), markedVMI("b", "n1", "Drain", 0), markedVMI("c", "n2", "Drain", 0)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "", "", 0)},
			config:     config(5, 1), want: []string{"c:Drain"}},
		{name: "a failed migration is retried after a backoff that grows",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n1", v1alpha1.MigrationFailed, 2*time.Second), migration("a", "n1", v1alpha1.MigrationFailed, 30*time.Second)},
			retryAfter: 8 * time.Second},
		// Seed 10's soak-0: the first attempt failed 25 s before the deadline when its target
		// node's agent was killed; a 5 s backoff and the same node again left the second 6 s.
		{name: "before a deadline, a failed attempt is retried at once, preferring another node",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n2", "NodePressure", 25)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{targetOn("n1", migration("a", "n2", v1alpha1.MigrationFailed, time.Second))},
			want:       []string{"a:NodePressure:prefers-not[n1]"}},
		{name: "before a deadline, failures that grew the backoff still wait a second at most",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n2", "NodePressure", 40)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				targetOn("n3", migration("a", "n2", v1alpha1.MigrationFailed, 300*time.Millisecond)), targetOn("n1", migration("a", "n2", v1alpha1.MigrationFailed, 10*time.Second)),
			},
			retryAfter: 700 * time.Millisecond},
		{name: "each node an attempt failed on is named once",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n2", "NodePressure", 40)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				targetOn("n3", migration("a", "n2", v1alpha1.MigrationFailed, 2*time.Second)), targetOn("n1", migration("a", "n2", v1alpha1.MigrationFailed, 10*time.Second)),
				targetOn("n3", migration("a", "n2", v1alpha1.MigrationFailed, 20*time.Second)),
			},
			want: []string{"a:NodePressure:prefers-not[n1 n3]"}},
		{name: "failures of an earlier evacuation are not avoided",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n2", "NodePressure", 40)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{targetOn("n1", migration("a", "n2", v1alpha1.MigrationFailed, 2*time.Minute))},
			want:       []string{"a:NodePressure"}},
		{name: "past the deadline, the backoff holds again",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n2", "NodePressure", -1)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n2", v1alpha1.MigrationFailed, 2*time.Second)},
			retryAfter: 3 * time.Second},
		{name: "after the backoff, the retry",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 60)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n1", v1alpha1.MigrationFailed, 6*time.Second)},
			want:       []string{"a:NodePressure"}},
		{name: "a target no node took: no retry while nothing changed",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{unschedulable(migration("a", "n1", v1alpha1.MigrationFailed, 30*time.Second))},
			awaiting:   []string{"a"}},
		{name: "a target no node took: the capacity changed before it failed",
			vmis:            []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0)},
			migrations:      []*v1alpha1.VirtualMachineInstanceMigration{unschedulable(migration("a", "n1", v1alpha1.MigrationFailed, 30*time.Second))},
			capacityChanged: 40 * time.Second, awaiting: []string{"a"}},
		{name: "a target no node took: retried once capacity changed, after the backoff",
			vmis:            []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0)},
			migrations:      []*v1alpha1.VirtualMachineInstanceMigration{unschedulable(migration("a", "n1", v1alpha1.MigrationFailed, 30*time.Second))},
			capacityChanged: 10 * time.Second, want: []string{"a:Drain"}},
		{name: "a target no node took, capacity changed just now: the backoff still holds",
			vmis:            []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0)},
			migrations:      []*v1alpha1.VirtualMachineInstanceMigration{unschedulable(migration("a", "n1", v1alpha1.MigrationFailed, 2*time.Second))},
			capacityChanged: time.Second, retryAfter: 3 * time.Second},
		{name: "a tenant's five stuck migrations do not count against the limits",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 30), markedVMI("b", "n1", "Drain", 0)},
			migrations: tenantsStuck(), config: config(5, 2), want: []string{"a:NodePressure", "b:Drain"}},
		{name: "a person's unfinished migration of the VMI itself: no second one",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{manual("ns", "by-hand", migration("a", "n1", v1alpha1.MigrationScheduling, 0))}},
		{name: "forged failures (labels naming the VMI, no record) do not hold it back",
			vmis: []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 60)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				forged("forged-1", "uid-a", time.Second), forged("forged-2", "uid-a", 2*time.Second),
				manual("ns", "forged-3", migration("a", "n1", v1alpha1.MigrationFailed, 3*time.Second)),
			},
			want: []string{"a:NodePressure"}},
		{name: "failures before this mark do not count",
			vmis:       []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "NodePressure", 60)},
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{migration("a", "n1", v1alpha1.MigrationFailed, 2*time.Minute)},
			want:       []string{"a:NodePressure"}},
		{name: "a drain of ten starts with two; none made ahead while their targets are not ready",
			vmis: drainOf(10), config: config(5, 2), want: []string{"d0:Drain", "d1:Drain"}},
		{name: "a target still preparing holds back those made ahead from its node only",
			vmis: append(drainOf(4)[2:], markedVMI("x", "n2", "Drain", 0)),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0), migration("d1", "n1", v1alpha1.MigrationPreparingTarget, 0),
				migration("w", "n2", v1alpha1.MigrationRunning, 0),
			},
			config: config(5, 1), prepare: []string{"x:Drain"}},
		{name: "once their targets are ready, two more are made ahead while they move memory",
			vmis: drainOf(10)[2:],
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0), migration("d1", "n1", v1alpha1.MigrationTargetReady, 0),
			},
			config: config(5, 2), prepare: []string{"d2:Drain", "d3:Drain"}},
		{name: "made ahead is bounded by the cluster's limit as well as the node's",
			vmis: append(drainOf(3), markedVMI("x", "n2", "Drain", 0), markedVMI("y", "n2", "Drain", 0), markedVMI("z", "n2", "Drain", 0)),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("p", "n1", v1alpha1.MigrationRunning, 0), migration("q", "n2", v1alpha1.MigrationRunning, 0),
			},
			config: config(2, 2), prepare: []string{"d0:Drain", "x:Drain"}},
		{name: "while the slots are taken, those made ahead wait, the one with its target ready following one under way, and no more are made",
			vmis: drainOf(6),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationScheduled, 0)),
			},
			config: config(5, 2), follow: []string{"d2-mig>d0-mig"}},
		{name: "those made ahead with their targets ready follow the migrations under way, the one that started first first",
			vmis: drainOf(4),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				startedAgo(time.Second, migration("d0", "n1", v1alpha1.MigrationRunning, 0)), startedAgo(3*time.Second, migration("d1", "n1", v1alpha1.MigrationRunning, 0)),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationTargetReady, 0)),
			},
			config: config(5, 2), follow: []string{"d2-mig>d1-mig", "d3-mig>d0-mig"}},
		{name: "a migration under way has one follower",
			vmis: drainOf(4),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				following("d0-mig-uid", madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0))), madeAhead(migration("d3", "n1", v1alpha1.MigrationTargetReady, 0)),
			},
			config: config(5, 2), follow: []string{"d3-mig>d1-mig"}},
		{name: "a follower has the slot once the guest of the one it followed runs on its target, before a more urgent candidate",
			vmis: append([]*v1alpha1.VirtualMachineInstance{markedVMI("d0", "n2", "Drain", 0, unmarked, ranOn("d0-mig-uid", true)), markedVMI("hot", "n1", "NodePressure", 30)}, drainOf(3)[1:]...),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				targetOn("n2", migration("d0", "n1", v1alpha1.MigrationRunning, 0)), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				following("d0-mig-uid", madeAhead(migration("d2", "n1", v1alpha1.MigrationRunning, 0))),
			},
			config: config(5, 2), release: []string{"d2-mig"}, prepare: []string{"hot:NodePressure"}},
		{name: "none follows on a node where a more urgent new candidate waits for a slot",
			vmis: append(drainOf(4), markedVMI("hot", "n1", "NodePressure", 30)),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationTargetReady, 0)),
			},
			config: config(5, 2)},
		{name: "a follower whose VMI is no longer marked is withdrawn when the one it followed ends",
			vmis: append(drainOf(2)[1:], markedVMI("d2", "n1", "Drain", 0, unmarked)),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationSucceeded, time.Second), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				following("d0-mig-uid", madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0))),
			},
			config: config(5, 2), withdraw: []string{"d2-mig"}},
		{name: "a freed slot goes to the one made ahead, and another is made ahead in its place",
			vmis: drainOf(6)[1:],
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationSucceeded, time.Second), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationScheduled, 0)),
			},
			config: config(5, 2), release: []string{"d2-mig"}, prepare: []string{"d4:Drain"}},
		{name: "a migration whose guest runs on its target gives up its slot before its phase says so",
			vmis: append([]*v1alpha1.VirtualMachineInstance{markedVMI("d0", "n2", "Drain", 0, unmarked, ranOn("d0-mig-uid", true))}, drainOf(6)[1:]...),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				targetOn("n2", migration("d0", "n1", v1alpha1.MigrationRunning, 0)), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationScheduled, 0)),
			},
			config: config(5, 2), release: []string{"d2-mig"}, prepare: []string{"d4:Drain"}},
		{name: "a migration its VMI does not record complete on its target keeps its slot",
			vmis: append([]*v1alpha1.VirtualMachineInstance{markedVMI("d0", "n1", "Drain", 0, ranOn("d0-mig-uid", false))}, drainOf(6)[1:]...),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				targetOn("n2", migration("d0", "n1", v1alpha1.MigrationRunning, 0)), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationScheduled, 0)),
			},
			config: config(5, 2), follow: []string{"d2-mig>d0-mig"}},
		{name: "a freed slot goes to one made ahead before a new one marked earlier",
			vmis: drainOf(6)[1:],
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationSucceeded, time.Second), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d5", "n1", v1alpha1.MigrationScheduled, 0)), madeAhead(migration("d4", "n1", v1alpha1.MigrationTargetReady, 0)),
			},
			config: config(5, 2), release: []string{"d4-mig"}, prepare: []string{"d2:Drain"}},
		{name: "a freed slot goes to node pressure before a drain made ahead",
			vmis: append(drainOf(4), markedVMI("hot", "n1", "NodePressure", 30)),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationTargetReady, 0)),
			},
			config: config(5, 2), want: []string{"hot:NodePressure"}, follow: []string{"d2-mig>d0-mig"}},
		{name: "made ahead for a VMI no longer marked, or gone: withdrawn; no other made ahead until they are gone",
			vmis: append(drainOf(4)[1:2], markedVMI("d2", "n1", "Drain", 0, unmarked), markedVMI("d4", "n1", "Drain", 0)),
			migrations: []*v1alpha1.VirtualMachineInstanceMigration{
				migration("d0", "n1", v1alpha1.MigrationRunning, 0), migration("d1", "n1", v1alpha1.MigrationRunning, 0),
				madeAhead(migration("d2", "n1", v1alpha1.MigrationTargetReady, 0)), madeAhead(migration("d3", "n1", v1alpha1.MigrationTargetReady, 0)),
			},
			config: config(5, 2), withdraw: []string{"d2-mig", "d3-mig"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var changed time.Time
			if tc.capacityChanged != 0 {
				changed = now.Add(-tc.capacityChanged)
			}
			d := Plan(tc.vmis, tc.migrations, tc.config, changed, now)
			var got, external, awaiting, prepare, release, withdraw, follow []string
			for _, c := range d.Create {
				got = append(got, fmt.Sprintf("%s:%s", c.VMI.Name, c.Cause))
				if len(c.FailedOn) > 0 {
					got[len(got)-1] += fmt.Sprintf(":prefers-not%v", c.FailedOn)
				}
			}
			for _, c := range d.Prepare {
				prepare = append(prepare, fmt.Sprintf("%s:%s", c.VMI.Name, c.Cause))
			}
			for _, m := range d.Release {
				release = append(release, m.Name)
			}
			for _, m := range d.Withdraw {
				withdraw = append(withdraw, m.Name)
			}
			for _, f := range d.Follow {
				follow = append(follow, f.Migration.Name+">"+f.After.Name)
			}
			for _, v := range d.External {
				external = append(external, v.Name)
			}
			for _, a := range d.AwaitingCapacity {
				awaiting = append(awaiting, a.VMI.Name)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || fmt.Sprint(external) != fmt.Sprint(tc.external) || d.RetryAfter != tc.retryAfter ||
				fmt.Sprint(awaiting) != fmt.Sprint(tc.awaiting) {
				t.Errorf("create %v external %v retryAfter %s awaiting %v; want %v %v %s %v", got, external, d.RetryAfter, awaiting,
					tc.want, tc.external, tc.retryAfter, tc.awaiting)
			}
			if fmt.Sprint(prepare) != fmt.Sprint(tc.prepare) || fmt.Sprint(release) != fmt.Sprint(tc.release) || fmt.Sprint(withdraw) != fmt.Sprint(tc.withdraw) {
				t.Errorf("prepare %v release %v withdraw %v; want %v %v %v", prepare, release, withdraw, tc.prepare, tc.release, tc.withdraw)
			}
			if fmt.Sprint(follow) != fmt.Sprint(tc.follow) {
				t.Errorf("follow %v; want %v", follow, tc.follow)
			}
		})
	}
}

// ranOn is a VMI whose status records the migration with UID uid, complete or not.
func ranOn(uid string, completed bool) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, Completed: completed}
	}
}

// drainOf is n VMIs d0, d1, ... on node n1 marked for a drain, d0 first.
func drainOf(n int) []*v1alpha1.VirtualMachineInstance {
	var vmis []*v1alpha1.VirtualMachineInstance
	for i := range n {
		vmis = append(vmis, markedVMI(fmt.Sprintf("d%d", i), "n1", "Drain", 0, func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.Conditions[1].LastTransitionTime = metav1.NewTime(now.Add(-time.Minute + time.Duration(i)*time.Millisecond))
		}))
	}
	return vmis
}
