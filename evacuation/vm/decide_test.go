package vm

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestDecide(t *testing.T) {
	vm := func(s v1alpha1.RunStrategy, ran bool) *v1alpha1.VirtualMachine {
		v := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "vm"}, Spec: v1alpha1.VirtualMachineSpec{RunStrategy: s}}
		if ran {
			v.Status.InstanceName = "vm"
		}
		return v
	}
	vmi := func(phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
		return &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: phase}}
	}
	deleting := vmi(v1alpha1.VMIRunning)
	deleting.DeletionTimestamp = &metav1.Time{}
	const (
		always, rerun, once, manual, halted = v1alpha1.RunStrategyAlways, v1alpha1.RunStrategyRerunOnFailure, v1alpha1.RunStrategyOnce, v1alpha1.RunStrategyManual, v1alpha1.RunStrategyHalted
		running, succeeded, failed          = v1alpha1.VMIRunning, v1alpha1.VMISucceeded, v1alpha1.VMIFailed
	)
	for _, tc := range []struct {
		name string
		vm   *v1alpha1.VirtualMachine
		vmi  *v1alpha1.VirtualMachineInstance
		want Action
	}{
		{"Always, new: start", vm(always, false), nil, Create},
		{"unset means Always", vm("", false), nil, Create},
		{"Always, running: keep", vm(always, true), vmi(running), Nothing},
		{"Always, shut down (an eviction of a None VM): start again", vm(always, true), vmi(succeeded), Restart},
		{"Always, failed: start again", vm(always, true), vmi(failed), Restart},
		{"Always, the old instance being deleted: wait", vm(always, true), deleting, Nothing},
		{"Always, the old instance gone: start again", vm(always, true), nil, Create},
		{"RerunOnFailure, new: start", vm(rerun, false), nil, Create},
		{"RerunOnFailure, failed: start again", vm(rerun, true), vmi(failed), Restart},
		{"RerunOnFailure, the guest shut down cleanly: stay stopped", vm(rerun, true), vmi(succeeded), Nothing},
		{"Once, new: start", vm(once, false), nil, Create},
		{"Once, ended: stay stopped", vm(once, true), vmi(failed), Nothing},
		{"Once, ran and gone: never again", vm(once, true), nil, Nothing},
		{"Manual, new: stay stopped", vm(manual, false), nil, Nothing},
		{"Manual, ended: stay stopped", vm(manual, true), vmi(succeeded), Nothing},
		{"Manual, running: keep", vm(manual, true), vmi(running), Nothing},
		{"Halted, running: stop", vm(halted, true), vmi(running), Stop},
		{"Halted, ended: clean up", vm(halted, true), vmi(failed), Clean},
		{"Halted, nothing: nothing", vm(halted, false), nil, Nothing},
		{"Halted, stopping: wait", vm(halted, true), deleting, Nothing},
	} {
		if got := Decide(tc.vm, tc.vmi); got != tc.want {
			t.Errorf("%s: Decide = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestStatus(t *testing.T) {
	now := metav1.Now()
	ready := []metav1.Condition{{Type: v1alpha1.VMIConditionReady, Status: metav1.ConditionTrue}}
	migrating := &v1alpha1.VirtualMachineInstanceMigrationState{StartTimestamp: &now}
	nodeLost := metav1.Condition{Type: v1alpha1.VMIConditionNodeLost, Status: metav1.ConditionTrue, Reason: "WaitingForNode",
		Message: "node node-2 is NotReady since 2026-11-28T12:01:05Z; the VM may still run there"}
	deleting := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", DeletionTimestamp: &now}, Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning}}
	for _, tc := range []struct {
		name          string
		strategy      v1alpha1.RunStrategy
		vmi           *v1alpha1.VirtualMachineInstance
		unschedulable bool
		want          v1alpha1.PrintableStatus
		ready         bool
	}{
		{name: "halted, nothing", strategy: v1alpha1.RunStrategyHalted, want: v1alpha1.PrintableStatusStopped},
		{name: "about to start", strategy: v1alpha1.RunStrategyAlways, want: v1alpha1.PrintableStatusStarting},
		{name: "scheduling", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIScheduling}}, want: v1alpha1.PrintableStatusStarting},
		{name: "no node for it", unschedulable: true, vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIScheduling}}, want: v1alpha1.PrintableStatusErrorUnschedulable},
		{name: "running and ready", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, Conditions: ready}}, want: v1alpha1.PrintableStatusRunning, ready: true},
		{name: "migrating", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, Conditions: ready, MigrationState: migrating}}, want: v1alpha1.PrintableStatusMigrating},
		{name: "stopping", vmi: deleting, want: v1alpha1.PrintableStatusStopping},
		{name: "shut down", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMISucceeded}}, want: v1alpha1.PrintableStatusStopped},
		{name: "failed", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIFailed}}, want: v1alpha1.PrintableStatusFailed},
		{name: "its node stopped answering", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, Conditions: append(ready, nodeLost)}}, want: v1alpha1.PrintableStatusWaitingForNode},
		{name: "stopping on a lost node: it waits for the node", vmi: func() *v1alpha1.VirtualMachineInstance {
			v := deleting.DeepCopy()
			v.Status.Conditions = []metav1.Condition{nodeLost}
			return v
		}(), want: v1alpha1.PrintableStatusWaitingForNode},
		{name: "failed once the node was known off", vmi: &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIFailed,
			Conditions: []metav1.Condition{{Type: v1alpha1.VMIConditionNodeLost, Status: metav1.ConditionFalse, Reason: "NodeOutOfService"}}}}, want: v1alpha1.PrintableStatusFailed},
	} {
		vm := &v1alpha1.VirtualMachine{Spec: v1alpha1.VirtualMachineSpec{RunStrategy: tc.strategy}, Status: v1alpha1.VirtualMachineStatus{Restarts: 2}}
		s := Status(vm, tc.vmi, tc.unschedulable, now)
		if s.PrintableStatus != tc.want || s.Ready != tc.ready || s.Restarts != 2 {
			t.Errorf("%s: status %s ready %v restarts %d, want %s ready %v restarts 2 (kept)", tc.name, s.PrintableStatus, s.Ready, s.Restarts, tc.want, tc.ready)
		}
		if c := meta.FindStatusCondition(s.Conditions, v1alpha1.VMIConditionReady); tc.want == v1alpha1.PrintableStatusWaitingForNode &&
			(c == nil || c.Reason != string(v1alpha1.PrintableStatusWaitingForNode) || !strings.Contains(c.Message, nodeLost.Message)) {
			t.Errorf("%s: the VM's Ready condition %+v must say why it waits: %q", tc.name, c, nodeLost.Message)
		}
	}
}

func TestCommands(t *testing.T) {
	vm := func(s v1alpha1.RunStrategy) *v1alpha1.VirtualMachine {
		return &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}, Spec: v1alpha1.VirtualMachineSpec{RunStrategy: s}}
	}
	vmi := func(phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
		return &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: phase}}
	}
	type fn func(*v1alpha1.VirtualMachine, *v1alpha1.VirtualMachineInstance) (Command, error)
	for _, tc := range []struct {
		name   string
		cmd    fn
		vm     *v1alpha1.VirtualMachine
		vmi    *v1alpha1.VirtualMachineInstance
		want   Command
		errHas string
	}{
		{"start a halted VM", StartCommand, vm(v1alpha1.RunStrategyHalted), nil, Command{SetRunStrategy: v1alpha1.RunStrategyAlways}, ""},
		{"start a manual VM", StartCommand, vm(v1alpha1.RunStrategyManual), nil, Command{CreateInstance: true}, ""},
		{"start a manual VM whose instance ended", StartCommand, vm(v1alpha1.RunStrategyManual), vmi(v1alpha1.VMISucceeded), Command{DeleteInstance: true, CreateInstance: true}, ""},
		{"start a running VM", StartCommand, vm(v1alpha1.RunStrategyAlways), vmi(v1alpha1.VMIRunning), Command{}, "running already"},
		{"start a Once VM that ran", StartCommand, vm(v1alpha1.RunStrategyOnce), vmi(v1alpha1.VMISucceeded), Command{}, "run strategy Once"},
		{"start a Once VM that has not run yet", StartCommand, vm(v1alpha1.RunStrategyOnce), nil, Command{}, "is starting already"},
		{"start a RerunOnFailure VM that shut down", StartCommand, vm(v1alpha1.RunStrategyRerunOnFailure), vmi(v1alpha1.VMISucceeded), Command{DeleteInstance: true}, ""},
		{"stop an Always VM", StopCommand, vm(v1alpha1.RunStrategyAlways), vmi(v1alpha1.VMIRunning), Command{SetRunStrategy: v1alpha1.RunStrategyHalted}, ""},
		{"stop a manual VM", StopCommand, vm(v1alpha1.RunStrategyManual), vmi(v1alpha1.VMIRunning), Command{DeleteInstance: true}, ""},
		{"stop a halted VM", StopCommand, vm(v1alpha1.RunStrategyHalted), nil, Command{}, "halted already"},
		{"restart an Always VM", RestartCommand, vm(v1alpha1.RunStrategyAlways), vmi(v1alpha1.VMIRunning), Command{DeleteInstance: true}, ""},
		{"restart a manual VM", RestartCommand, vm(v1alpha1.RunStrategyManual), vmi(v1alpha1.VMIRunning), Command{}, "use stop, then start"},
	} {
		got, err := tc.cmd(tc.vm, tc.vmi)
		switch {
		case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), "ns/vm")):
			t.Errorf("%s: error %v, want one naming ns/vm and saying %q", tc.name, err, tc.errHas)
		case tc.errHas == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}
