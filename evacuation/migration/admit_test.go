package migration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestAdmit(t *testing.T) {
	now := time.Date(2026, 11, 27, 22, 0, 0, 0, time.UTC)
	// mig is a migration in ns of vmi, created ago before now; evacuation: recorded as the
	// evacuation controller's.
	mig := func(ns, name, vmi string, ago time.Duration, phase v1alpha1.VirtualMachineInstanceMigrationPhase, evacuation bool) *v1alpha1.VirtualMachineInstanceMigration {
		m := &v1alpha1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name), CreationTimestamp: metav1.NewTime(now.Add(-ago))},
			Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
			Status:     v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase},
		}
		if evacuation {
			m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: "uid-" + vmi}
		}
		return m
	}
	labelled := func(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
		m.Labels = map[string]string{v1alpha1.LabelEvacuation: "true", v1alpha1.LabelVMIUID: "uid-victim"}
		return m
	}
	deleting := func(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
		m.DeletionTimestamp = &metav1.Time{Time: now}
		return m
	}
	// stuck are a tenant's unfinished Manual migrations of n VMIs of its own.
	stuck := func(n int) []*v1alpha1.VirtualMachineInstanceMigration {
		var ms []*v1alpha1.VirtualMachineInstanceMigration
		for i := range n {
			ms = append(ms, mig("tenant", fmt.Sprintf("stuck-%d", i), fmt.Sprintf("vm-%d", i), time.Minute, v1alpha1.MigrationScheduling, false))
		}
		return ms
	}
	cases := []struct {
		name     string
		m        *v1alpha1.VirtualMachineInstanceMigration
		others   []*v1alpha1.VirtualMachineInstanceMigration
		refused  string // the refusal's kind, "" if none
		says     string
		wait     time.Duration
		manualOK int // the manual limit; 0: the default
	}{
		{name: "a VMI's only migration starts",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false)},
		{name: "a second migration of a VMI fails at once, naming the first",
			m:       mig("ns", "second", "vm", 0, v1alpha1.MigrationPending, false),
			others:  []*v1alpha1.VirtualMachineInstanceMigration{mig("ns", "first", "vm", time.Second, v1alpha1.MigrationScheduling, true)},
			refused: RefusedConcurrent, says: "VMI vm is already migrating with migration first"},
		{name: "an evacuation's migration created after a person's fails too: one at a time",
			m:       mig("ns", "evacuation", "vm", 0, "", true),
			others:  []*v1alpha1.VirtualMachineInstanceMigration{mig("ns", "by-hand", "vm", time.Second, v1alpha1.MigrationPending, false)},
			refused: RefusedConcurrent, says: "migration by-hand"},
		{name: "created in the same second: the name decides",
			m:       mig("ns", "b", "vm", 0, v1alpha1.MigrationPending, false),
			others:  []*v1alpha1.VirtualMachineInstanceMigration{mig("ns", "a", "vm", 0, v1alpha1.MigrationPending, false)},
			refused: RefusedConcurrent},
		{name: "the first of a VMI's migrations starts although later ones exist",
			m:      mig("ns", "a", "vm", 0, v1alpha1.MigrationPending, false),
			others: []*v1alpha1.VirtualMachineInstanceMigration{mig("ns", "b", "vm", 0, v1alpha1.MigrationPending, false)}},
		{name: "ended and deleted migrations of the VMI do not count",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false),
			others: []*v1alpha1.VirtualMachineInstanceMigration{mig("ns", "failed", "vm", time.Minute, v1alpha1.MigrationFailed, true),
				mig("ns", "done", "vm", time.Minute, v1alpha1.MigrationSucceeded, false), deleting(mig("ns", "cancelled", "vm", time.Minute, v1alpha1.MigrationRunning, false))}},
		{name: "a VMI of the same name in another namespace is another VMI",
			m:      mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false),
			others: []*v1alpha1.VirtualMachineInstanceMigration{mig("tenant", "m", "vm", time.Minute, v1alpha1.MigrationRunning, false)}},
		{name: "past the manual limit, a person's migration fails at once",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false), others: stuck(5),
			refused: RefusedManualLimit, says: "5 manual migrations are already under way"},
		{name: "within the manual limit, it starts",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false), others: stuck(4)},
		{name: "the configured manual limit holds",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false), others: stuck(2), manualOK: 2,
			refused: RefusedManualLimit},
		{name: "a tenant's stuck migrations do not hold back an evacuation",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, true), others: stuck(5)},
		{name: "evacuations do not count against the manual limit",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false),
			others: []*v1alpha1.VirtualMachineInstanceMigration{mig("a", "e1", "vm", time.Minute, v1alpha1.MigrationRunning, true),
				mig("b", "e2", "vm", time.Minute, v1alpha1.MigrationRunning, true)}, manualOK: 1},
		{name: "a person's later migrations of one VMI count once",
			m: mig("ns", "m", "vm", 0, v1alpha1.MigrationPending, false),
			others: []*v1alpha1.VirtualMachineInstanceMigration{mig("tenant", "x1", "own", time.Minute, v1alpha1.MigrationScheduling, false),
				mig("tenant", "x2", "own", 30*time.Second, v1alpha1.MigrationPending, false)}, manualOK: 2},
		{name: "newer migrations do not count against an older one",
			m: mig("ns", "m", "vm", time.Hour, v1alpha1.MigrationPending, false), others: stuck(5)},
		{name: "labelled as an evacuation's, unrecorded: it waits for the record",
			m: labelled(mig("ns", "m", "vm", 4*time.Second, v1alpha1.MigrationPending, false)), others: stuck(5), wait: 6 * time.Second},
		{name: "labelled as an evacuation's, never recorded: a person's",
			m: labelled(mig("ns", "m", "vm", 10*time.Second, v1alpha1.MigrationPending, false)), others: stuck(5),
			refused: RefusedManualLimit},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit := DefaultParallelManualMigrations
			if tc.manualOK != 0 {
				limit = tc.manualOK
			}
			all := append([]*v1alpha1.VirtualMachineInstanceMigration{tc.m}, tc.others...)
			refusal, wait := Admit(tc.m, all, limit, now)
			kind, says := "", ""
			if refusal != nil {
				kind, says = refusal.Kind, refusal.Reason
			}
			if kind != tc.refused || !strings.Contains(says, tc.says) || wait != tc.wait {
				t.Errorf("refused %q (%q), wait %s; want refused %q saying %q, wait %s", kind, says, wait, tc.refused, tc.says, tc.wait)
			}
		})
	}
}
