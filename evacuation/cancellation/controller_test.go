package cancellation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestCancellable(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "uid-a"}}
	mig := func(name, uid string, evacuation bool, phase v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
		// Every one carries the labels of an evacuation's migration; only the record says it is one.
		m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{v1alpha1.LabelVMIUID: uid, v1alpha1.LabelEvacuation: "true"}}}
		if evacuation {
			m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: uid}
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

func TestDecide(t *testing.T) {
	deadline := metav1.NewTime(time.Date(2026, 11, 25, 12, 0, 45, 0, time.UTC))
	marked := func(cause v1alpha1.MigrationCause, deadline *metav1.Time) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{}
		v.Status.NodeName, v.Status.EvacuationNodeName, v.Status.EvacuationDeadline = "node-1", "node-1", deadline
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue, Reason: string(cause)}}
		return v
	}
	cases := []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		cancel bool
		says   string
	}{
		{"a drain's mark (no deadline): cancelled", marked(v1alpha1.MigrationCauseAPIEviction, nil), true, ""},
		{"an EvictionRequest's mark: cancelled", marked(v1alpha1.MigrationCauseEvictionRequest, nil), true, ""},
		{"not marked: nothing to refuse", &v1alpha1.VirtualMachineInstance{}, true, ""},
		{"the kubelet is killing the pod: refused, the node's deadline wins", marked(v1alpha1.MigrationCauseNodePressure, &deadline), false,
			"already being stopped (NodePressure): it goes at 2026-11-25T12:00:45Z whatever is cancelled"},
		{"the pod was deleted: refused", marked(v1alpha1.MigrationCausePodDeleted, &deadline), false, "(PodDeleted)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cancel, why := Decide(tc.vmi)
			if cancel != tc.cancel || !strings.Contains(why, tc.says) {
				t.Errorf("Decide = %v, %q; want %v, saying %q", cancel, why, tc.cancel, tc.says)
			}
		})
	}
}
