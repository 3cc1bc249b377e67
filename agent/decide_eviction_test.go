package agent

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// deleted says the launcher pod of dom was deleted through the API, with deadline and reason.
func deleted(dom *Domain, deadline time.Time, reason string) *Domain {
	dom.Deletion = &PodDeletion{Deadline: deadline, DisruptionReason: reason}
	return dom
}

func TestDecideOnNodePressure(t *testing.T) {
	signal := t0
	podDeadline := t0.Add(35 * time.Second)
	liveMigrate := func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	}
	marked := func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.EvacuationNodeName = "node-1"
		v.Status.EvacuationDeadline = ptr.To(metav1.NewTime(t0.Add(30 * time.Second)))
	}
	signalled := func() *Domain {
		return &Domain{State: DomainRunning, GracefulShutdown: &signal, PodDeadline: &podDeadline}
	}
	cases := []struct {
		name         string
		vmi          *v1alpha1.VirtualMachineInstance
		dom          *Domain
		ev           Eviction
		now          time.Time
		wantMark     bool // the VMI carries the mark afterwards
		wantNewMark  bool
		wantShutdown bool
		wantLost     bool
		wantDecision string
		wantDeadline time.Duration // after the signal
		wantMessage  string        // in the EvictionRequested condition
		wantCause    v1alpha1.MigrationCause
	}{
		{name: "gate on, LiveMigrate: marked and held, deadline from the kubelet maximum",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate), dom: signalled(), ev: Eviction{Config: gateOn(nil), MaxPodGracePeriod: ptr.To[int64](30)}, now: t0.Add(50 * time.Millisecond),
			wantMark: true, wantNewMark: true, wantDecision: DecisionEvacuate, wantDeadline: 30 * time.Second, wantMessage: "must leave node node-1 by 2026-11-22T03:00:30Z"},
		{name: "the pod deleted through the API (kubectl delete pod): its own cause, and the deadline the API server set",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate), dom: deleted(signalled(), t0.Add(40*time.Second), ""), ev: Eviction{Config: gateOn(nil), MaxPodGracePeriod: ptr.To[int64](30)}, now: t0,
			wantMark: true, wantNewMark: true, wantDecision: DecisionEvacuate, wantDeadline: 40 * time.Second, wantCause: v1alpha1.MigrationCausePodDeleted,
			wantMessage: "the launcher pod was deleted through the API; SIGTERM at 2026-11-22T03:00:00Z"},
		{name: "the pod evicted through the API (its DisruptionTarget says so): APIEviction",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate), dom: deleted(signalled(), t0.Add(20*time.Second), "EvictionByEvictionAPI"), ev: Eviction{Config: gateOn(nil), MaxPodGracePeriod: ptr.To[int64](30)}, now: t0,
			wantMark: true, wantNewMark: true, wantDecision: DecisionEvacuate, wantDeadline: 20 * time.Second, wantCause: v1alpha1.MigrationCauseAPIEviction,
			wantMessage: "(EvictionByEvictionAPI)"},
		{name: "the kubelet's own eviction: NodePressure",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate), dom: signalled(), ev: Eviction{Config: gateOn(nil), MaxPodGracePeriod: ptr.To[int64](30)}, now: t0,
			wantMark: true, wantNewMark: true, wantDecision: DecisionEvacuate, wantDeadline: 30 * time.Second, wantCause: v1alpha1.MigrationCauseNodePressure},
		{name: "a deletion learned after the mark corrects its cause and deadline",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate, marked), dom: deleted(signalled(), t0.Add(40*time.Second), ""), ev: Eviction{Config: gateOn(nil), MaxPodGracePeriod: ptr.To[int64](30)}, now: t0.Add(time.Second),
			wantMark: true, wantDeadline: 40 * time.Second, wantCause: v1alpha1.MigrationCausePodDeleted},
		{name: "kubelet setting unknown: the pod's grace, and the message says so",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate), dom: signalled(), ev: Eviction{Config: gateOn(nil)}, now: t0,
			wantMark: true, wantNewMark: true, wantDecision: DecisionEvacuate, wantDeadline: 35 * time.Second, wantMessage: "assuming the pod's grace period of 35s"},
		{name: "already marked: no second event or decision",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate, marked), dom: signalled(), ev: Eviction{Config: gateOn(nil), MaxPodGracePeriod: ptr.To[int64](30)}, now: t0.Add(time.Second),
			wantMark: true, wantDeadline: 30 * time.Second},
		{name: "gate off: graceful shutdown, as before",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate), dom: signalled(), ev: Eviction{Config: &v1alpha1.LifeboatConfig{}}, now: t0,
			wantShutdown: true, wantDecision: DecisionShutdown},
		{name: "user deletes a marked VMI: shut down",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate, marked, deletedAt(t0.Add(5*time.Second))), dom: signalled(), ev: Eviction{Config: gateOn(nil)}, now: t0.Add(6 * time.Second),
			wantMark: true, wantShutdown: true},
		{name: "deadline passed with the VM still here and gone: lost",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate, marked), dom: nil, ev: Eviction{Config: gateOn(nil)}, now: t0.Add(31 * time.Second),
			wantMark: true, wantLost: true, wantMessage: "it was lost"},
		{name: "lost is recorded once, even after the VMI failed",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := testVMI(v1alpha1.VMIFailed, liveMigrate, marked)
				v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionFalse, Reason: ReasonEvacuationDeadlineExceeded}}
				return v
			}(), dom: nil, ev: Eviction{Config: gateOn(nil)}, now: t0.Add(40 * time.Second),
			wantMark: true},
		{name: "a signal that came with the guest from the migration's source is not this node's",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := testVMI(v1alpha1.VMIRunning, liveMigrate)
				v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-0", TargetNode: "node-1", Completed: true,
					EndTimestamp: ptr.To(metav1.NewTime(t0.Add(3 * time.Second)))}
				return v
			}(), dom: signalled(), ev: Eviction{Config: gateOn(nil)}, now: t0.Add(4 * time.Second)},
		{name: "the pod ended (the VMI failed) long before the deadline: a hard eviction, lost at once",
			vmi: func() *v1alpha1.VirtualMachineInstance {
				v := testVMI(v1alpha1.VMIFailed, liveMigrate, marked)
				v.Status.Message = "Evicted: The node was low on resource: memory."
				return v
			}(), dom: nil, ev: Eviction{Config: gateOn(nil)}, now: t0.Add(2 * time.Second),
			wantMark: true, wantLost: true, wantMessage: "before the evacuation deadline 2026-11-22T03:00:30Z (a hard eviction or a force deletion gives no grace: Evicted: The node was low"},
		{name: "deadline not reached and the launcher reconnecting: nothing yet",
			vmi: testVMI(v1alpha1.VMIRunning, liveMigrate, marked), dom: nil, ev: Eviction{Config: gateOn(nil)}, now: t0.Add(10 * time.Second),
			wantMark: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Decide(tc.vmi, tc.dom, tc.ev, "node-1", tc.now)
			status := tc.vmi.Status
			if plan.Status != nil {
				status = *plan.Status
			}
			if got := status.EvacuationNodeName == "node-1"; got != tc.wantMark {
				t.Errorf("marked = %v, want %v", got, tc.wantMark)
			}
			if plan.Marked != tc.wantNewMark || plan.Shutdown != tc.wantShutdown || plan.Lost != tc.wantLost || plan.SignalDecision != tc.wantDecision {
				t.Errorf("plan marked=%v shutdown=%v lost=%v decision=%q, want %v %v %v %q",
					plan.Marked, plan.Shutdown, plan.Lost, plan.SignalDecision, tc.wantNewMark, tc.wantShutdown, tc.wantLost, tc.wantDecision)
			}
			if tc.wantDeadline != 0 && (status.EvacuationDeadline == nil || status.EvacuationDeadline.Sub(t0) != tc.wantDeadline) {
				t.Errorf("deadline = %v, want signal + %s", status.EvacuationDeadline, tc.wantDeadline)
			}
			if tc.wantMessage != "" {
				c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionEvictionRequested)
				if c == nil || !strings.Contains(c.Message, tc.wantMessage) {
					t.Errorf("EvictionRequested condition %+v does not say %q", c, tc.wantMessage)
				}
			}
			if tc.wantCause != "" {
				c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionEvictionRequested)
				if c == nil || c.Reason != string(tc.wantCause) {
					t.Errorf("EvictionRequested condition %+v, want reason %s", c, tc.wantCause)
				}
			}
			if tc.wantNewMark {
				if len(plan.Events) == 0 || plan.Events[len(plan.Events)-1].Reason != ReasonEvacuationRequested {
					t.Errorf("a new mark needs an %s event, got %+v", ReasonEvacuationRequested, plan.Events)
				}
			}
		})
	}
}
