package cancellation

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestCancellable(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "uid-a"}}
	mig := func(name, uid string, evacuation bool, phase v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelVMIUID: uid}}}
		if evacuation {
			m.Labels[v1alpha1.LabelEvacuation] = "true"
		}
		m.Status.Phase = phase
		return m
	}
	deleting := mig("deleting", "uid-a", true, v1alpha1.MigrationScheduling)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	cases := []struct {
		name string
		m    *v1alpha1.VirtualMachineInstanceMigration
		want bool
	}{
		{"a new evacuation migration: deleted", mig("new", "uid-a", true, ""), true},
		{"waiting for its target: deleted", mig("scheduling", "uid-a", true, v1alpha1.MigrationScheduling), true},
		{"target ready: deleted", mig("ready", "uid-a", true, v1alpha1.MigrationTargetReady), true},
		{"running: left to the source agent, which aborts it when the mark is gone", mig("running", "uid-a", true, v1alpha1.MigrationRunning), false},
		{"finished: kept as a record", mig("done", "uid-a", true, v1alpha1.MigrationSucceeded), false},
		{"failed: kept as a record", mig("failed", "uid-a", true, v1alpha1.MigrationFailed), false},
		{"made by a person, not an evacuation: kept", mig("manual", "uid-a", false, v1alpha1.MigrationScheduling), false},
		{"another VMI's: kept", mig("other", "uid-b", true, v1alpha1.MigrationScheduling), false},
		{"already being deleted: nothing to do", deleting, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Cancellable(vmi, []*v1alpha1.VirtualMachineInstanceMigration{tc.m})
			if (len(got) == 1) != tc.want {
				t.Errorf("cancellable = %v, want %v", fmt.Sprint(len(got) == 1), tc.want)
			}
		})
	}
}
