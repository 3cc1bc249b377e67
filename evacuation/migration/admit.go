package migration

import (
	"cmp"
	"fmt"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// ReasonRefused is the Event reason of a migration refused before its target pod was made.
const ReasonRefused = "MigrationRefused"

// What refused a migration (the metric's label).
const (
	// RefusedConcurrent: its VMI already has a migration under way.
	RefusedConcurrent = "Concurrent"
	// RefusedManualLimit: the cluster runs as many Manual migrations as it allows.
	RefusedManualLimit = "ManualLimit"
)

// DefaultParallelManualMigrations is the Manual migrations' limit when the configuration sets none.
const DefaultParallelManualMigrations = 5

// recordWait is how long a migration labelled as an evacuation's waits for the evacuation
// controller's record (status.evacuation), which it writes right after it creates the migration,
// before it is taken for a person's. The label is anyone's to set: it only buys this wait.
const recordWait = 10 * time.Second

// Refusal is why a migration may not start.
type Refusal struct{ Kind, Reason string }

// Admit decides whether m, about to get its target pod, may start, given all the cluster's
// migrations: a VMI has one migration at a time (the one created first), and Manual migrations
// (without the evacuation controller's record) have a limit of their own, manualLimit, so that
// they never hold back evacuations and evacuations never hold them back. It returns the
// refusal, if any (m then fails at once), and otherwise how long m must still wait for its
// record, 0 if not at all.
func Admit(m *v1alpha1.VirtualMachineInstanceMigration, all []*v1alpha1.VirtualMachineInstanceMigration, manualLimit int, now time.Time) (*Refusal, time.Duration) {
	// first is each VMI's first unfinished migration, the one under way.
	first := map[string]*v1alpha1.VirtualMachineInstanceMigration{}
	for _, o := range all {
		if o.UID == m.UID || o.Status.Phase.Terminal() || o.DeletionTimestamp != nil {
			continue
		}
		if f := first[vmiKey(o)]; f == nil || createdBefore(o, f) {
			first[vmiKey(o)] = o
		}
	}
	if f := first[vmiKey(m)]; f != nil && createdBefore(f, m) {
		return &Refusal{RefusedConcurrent, fmt.Sprintf("VMI %s is already migrating with migration %s; a VMI has one migration at a time", m.Spec.VMIName, f.Name)}, 0
	}
	if m.EvacuatedVMI() != "" {
		return nil, 0
	}
	if wait := RecordWait(m, now); wait > 0 {
		return nil, wait
	}
	manual := 0
	for _, f := range first {
		if f.EvacuatedVMI() == "" && createdBefore(f, m) {
			manual++
		}
	}
	if manual >= manualLimit {
		return &Refusal{RefusedManualLimit, fmt.Sprintf("%d manual migrations are already under way in the cluster, as many as spec.migrations.parallelManualMigrationsPerCluster allows; create it again once one has ended", manual)}, 0
	}
	return nil, 0
}

// RecordWait is how long m, labelled as an evacuation's and without its record yet, may still
// wait for the evacuation controller to write it; 0 for any other migration, or once
// recordWait has passed.
func RecordWait(m *v1alpha1.VirtualMachineInstanceMigration, now time.Time) time.Duration {
	if m.EvacuatedVMI() != "" || m.Labels[v1alpha1.LabelEvacuation] != "true" {
		return 0
	}
	return max(recordWait-now.Sub(m.CreationTimestamp.Time), 0)
}

// ManualLimit is the cluster's limit on Manual migrations; config may be nil.
func ManualLimit(config *v1alpha1.LifeboatConfig) int {
	if config == nil || config.Spec.Migrations.ParallelManualMigrationsPerCluster == nil {
		return DefaultParallelManualMigrations
	}
	return int(*config.Spec.Migrations.ParallelManualMigrationsPerCluster)
}

func vmiKey(m *v1alpha1.VirtualMachineInstanceMigration) string {
	return m.Namespace + "/" + m.Spec.VMIName
}

// createdBefore orders migrations by creation, then by namespace and name (the API's creation
// times have whole seconds).
func createdBefore(a, b *v1alpha1.VirtualMachineInstanceMigration) bool {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c < 0
	}
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) < 0
}
