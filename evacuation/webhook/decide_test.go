package webhook

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

type vmiOpt func(*v1alpha1.VirtualMachineInstance)

// runningVMI is a VMI running on node-a with a strategy (nil: unset) and a LiveMigratable condition.
func runningVMI(strategy *v1alpha1.EvictionStrategy, migratable bool, opts ...vmiOpt) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}}
	v.Spec.EvictionStrategy = strategy
	v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, "node-a"
	c := metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"}
	if !migratable {
		c.Status, c.Reason = metav1.ConditionFalse, "LocalDisk"
	}
	v.Status.Conditions = []metav1.Condition{c}
	for _, o := range opts {
		o(v)
	}
	return v
}

// noTarget: the evacuation controller found no node other than node-a to take the VM.
func noTarget(v *v1alpha1.VirtualMachineInstance) {
	v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: v1alpha1.VMIReasonNoTargetNode,
		Message: "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=node-a"}}
}

func alreadyMarked(v *v1alpha1.VirtualMachineInstance) {
	v.Status.EvacuationNodeName = v.Status.NodeName
}

func launcher(node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
}

var (
	none       = ptr.To(v1alpha1.EvictionStrategyNone)
	live       = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	ifPossible = ptr.To(v1alpha1.EvictionStrategyLiveMigrateIfPossible)
	external   = ptr.To(v1alpha1.EvictionStrategyExternal)
)

// TestDecide mirrors seed 000's webhook table row for row (with lifeboat's 429 for a mark, the
// descheduler's protocol of seed 003), then the cases the table leaves implicit.
func TestDecide(t *testing.T) {
	running := launcher("node-a", corev1.PodRunning)
	cases := []struct {
		name     string
		pod      *corev1.Pod
		vmi      *v1alpha1.VirtualMachineInstance
		config   *v1alpha1.LifeboatConfig
		dryRun   bool
		want     Answer
		mark     bool
		contains string
	}{
		// Seed 000, "Eviction Strategy | Is VMI migratable | Is VMI marked | Webhook response".
		{name: "not a launcher pod: allowed", pod: nil, want: AnswerAllowed},
		{name: "None, migratable: allowed, not marked", pod: running, vmi: runningVMI(none, true), want: AnswerAllowed},
		{name: "None, not migratable: allowed, not marked", pod: running, vmi: runningVMI(none, false), want: AnswerAllowed},
		{name: "LiveMigrate, migratable: marked, 429", pod: running, vmi: runningVMI(live, true), want: AnswerEvacuating, mark: true, contains: `Eviction triggered evacuation of VMI "ns/vm"`},
		{name: "LiveMigrate, not migratable: denied with the reason, not marked", pod: running, vmi: runningVMI(live, false), want: AnswerDenied, contains: "LocalDisk"},
		{name: "LiveMigrateIfPossible, migratable: marked, 429", pod: running, vmi: runningVMI(ifPossible, true), want: AnswerEvacuating, mark: true, contains: `Eviction triggered evacuation of VMI "ns/vm"`},
		{name: "LiveMigrateIfPossible, not migratable: allowed, not marked", pod: running, vmi: runningVMI(ifPossible, false), want: AnswerAllowed},
		{name: "External, migratable: marked, 429", pod: running, vmi: runningVMI(external, true), want: AnswerEvacuating, mark: true, contains: `Eviction triggered evacuation of VMI "ns/vm"`},
		{name: "External, not migratable: marked, 429", pod: running, vmi: runningVMI(external, false), want: AnswerEvacuating, mark: true, contains: "External"},

		// What the table leaves implicit.
		{name: "dry run: the same answer, nothing marked", pod: running, vmi: runningVMI(live, true), dryRun: true, want: AnswerEvacuating, contains: `Eviction triggered evacuation of VMI "ns/vm"`},
		{name: "already marked: 429 Evacuation in progress, not marked again", pod: running, vmi: runningVMI(live, true, alreadyMarked), want: AnswerInProgress, contains: `Evacuation in progress: Eviction triggered evacuation of VMI "ns/vm"`},
		{name: "External already marked: in progress", pod: running, vmi: runningVMI(external, false, alreadyMarked), want: AnswerInProgress, contains: "Evacuation in progress"},
		// A VM no other node can take (issue 44 item 4): as one that cannot migrate, at once.
		{name: "LiveMigrate, no node can take it: denied naming why, not marked", pod: running, vmi: runningVMI(live, true, noTarget), want: AnswerDenied,
			contains: "cannot be live-migrated (NoTargetNode: no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=node-a)"},
		{name: "LiveMigrateIfPossible, no node can take it: allowed (an ordinary eviction)", pod: running, vmi: runningVMI(ifPossible, true, noTarget), want: AnswerAllowed},
		{name: "External, no node can take it: marked, left to the external controller", pod: running, vmi: runningVMI(external, true, noTarget), want: AnswerEvacuating, mark: true, contains: "External"},
		{name: "LiveMigrateIfPossible marked but no longer migratable: allowed", pod: running, vmi: runningVMI(ifPossible, false, alreadyMarked), want: AnswerAllowed},
		{name: "the strategy falls back to the cluster's", pod: running, vmi: runningVMI(nil, true),
			config: &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{EvictionStrategy: live}}, want: AnswerEvacuating, mark: true},
		{name: "no strategy anywhere: None", pod: running, vmi: runningVMI(nil, true), want: AnswerAllowed},
		{name: "the launcher's VMI is gone: allowed", pod: running, vmi: nil, want: AnswerAllowed},
		{name: "the VMI has ended: allowed", pod: running, vmi: runningVMI(live, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMISucceeded }), want: AnswerAllowed},
		{name: "a finished source pod after the VM left: allowed", pod: launcher("node-a", corev1.PodSucceeded), vmi: runningVMI(live, true), want: AnswerAllowed},
		{name: "a migration's target pod: left to its budget", pod: launcher("node-b", corev1.PodRunning), vmi: runningVMI(live, true), want: AnswerAllowed},
		{name: "LiveMigrate, not running yet: denied", pod: launcher("node-a", corev1.PodPending),
			vmi: runningVMI(live, true, func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMIScheduled }), want: AnswerDenied, contains: "Scheduled"},
		{name: "External, not on a node yet: denied", pod: launcher("", corev1.PodPending),
			vmi: runningVMI(external, false, func(v *v1alpha1.VirtualMachineInstance) {
				v.Status.Phase, v.Status.NodeName = v1alpha1.VMIScheduling, ""
			}), want: AnswerDenied},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.pod, tc.vmi, tc.config, tc.dryRun)
			if d.Answer != tc.want || d.Mark != tc.mark || !strings.Contains(d.Message, tc.contains) {
				t.Errorf("got %s mark=%v %q; want %s mark=%v containing %q", d.Answer, d.Mark, d.Message, tc.want, tc.mark, tc.contains)
			}
			if wantCode := int32(429); !d.Allowed() && d.Code() != wantCode {
				t.Errorf("a refusal answers %d, want %d", d.Code(), wantCode)
			}
			if d.Answer == AnswerDenied && strings.Contains(d.Message, EvacuationText) {
				t.Errorf("a denial must not read as an evacuation to the descheduler: %q", d.Message)
			}
		})
	}
}
