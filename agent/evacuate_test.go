package agent

import (
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
)

func gateOn(strategy *v1alpha1.EvictionStrategy) *v1alpha1.LifeboatConfig {
	return &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{
		FeatureGates:     []v1alpha1.FeatureGate{v1alpha1.FeatureGateNodePressureEvictionLiveMigration},
		EvictionStrategy: strategy,
	}}
}

// TestShouldEvacuateVMI has one row per case of seed 001's shouldEvacuateVMI.
func TestShouldEvacuateVMI(t *testing.T) {
	signal := t0
	strategy := func(s v1alpha1.EvictionStrategy) vmiOpt {
		return func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = ptr.To(s) }
	}
	signalled := &Domain{State: DomainRunning, GracefulShutdown: &signal}
	notMigratable := &Domain{State: DomainRunning, GracefulShutdown: &signal, NotMigratableReason: "LocalDisk"}
	cases := []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		dom    *Domain
		config *v1alpha1.LifeboatConfig
		want   bool
	}{
		{"feature gate off", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), signalled, &v1alpha1.LifeboatConfig{}, false},
		{"no LifeboatConfig: gate off", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), signalled, nil, false},
		{"no VMI", nil, signalled, gateOn(nil), false},
		{"no domain", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), nil, gateOn(nil), false},
		{"VMI not running", testVMI(v1alpha1.VMIScheduled, strategy(v1alpha1.EvictionStrategyLiveMigrate)), signalled, gateOn(nil), false},
		{"domain not alive", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), &Domain{State: DomainShutoff, GracefulShutdown: &signal}, gateOn(nil), false},
		{"domain paused: alive", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), &Domain{State: DomainPaused, GracefulShutdown: &signal}, gateOn(nil), true},
		{"domain PM-suspended: alive", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), &Domain{State: DomainPMSuspended, GracefulShutdown: &signal}, gateOn(nil), true},
		{"domain crashed: not alive", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), &Domain{State: DomainCrashed, GracefulShutdown: &signal}, gateOn(nil), false},
		{"VMI being deleted", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate), deletedAt(t0)), signalled, gateOn(nil), false},
		{"no graceful-shutdown trigger", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), &Domain{State: DomainRunning}, gateOn(nil), false},
		{"LiveMigrate, migratable", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), signalled, gateOn(nil), true},
		{"LiveMigrate, not migratable", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate)), notMigratable, gateOn(nil), false},
		{"LiveMigrateIfPossible, migratable", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible)), signalled, gateOn(nil), true},
		{"LiveMigrateIfPossible, not migratable", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible)), notMigratable, gateOn(nil), false},
		{"LiveMigrate, no node can take it now (NoTargetNode): marked all the same, one may come within the grace", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyLiveMigrate), withNoTargetNode), signalled, gateOn(nil), true},
		{"External, no node can take it: still left to the external controller", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyExternal), withNoTargetNode), signalled, gateOn(nil), true},
		{"External", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyExternal)), notMigratable, gateOn(nil), true},
		{"None", testVMI(v1alpha1.VMIRunning, strategy(v1alpha1.EvictionStrategyNone)), signalled, gateOn(nil), false},
		{"no strategy on the VMI: the cluster's", testVMI(v1alpha1.VMIRunning), signalled, gateOn(ptr.To(v1alpha1.EvictionStrategyLiveMigrate)), true},
		{"no strategy anywhere: None", testVMI(v1alpha1.VMIRunning), signalled, gateOn(nil), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ShouldEvacuateVMI(tc.vmi, tc.dom, tc.config); got != tc.want {
				t.Errorf("ShouldEvacuateVMI = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEvictionDeadline(t *testing.T) {
	cases := []struct {
		name        string
		podGrace    time.Duration
		maxGrace    *int64
		want        time.Duration
		wantAssumed bool
	}{
		{"kubelet maximum shorter than the pod's grace", 45 * time.Second, ptr.To[int64](30), 30 * time.Second, false},
		{"pod's grace shorter than the kubelet maximum", 45 * time.Second, ptr.To[int64](300), 45 * time.Second, false},
		{"kubelet maximum 0 (its default): the one-second minimum", 45 * time.Second, ptr.To[int64](0), time.Second, false},
		{"kubelet setting unknown: the pod's grace, assumed", 45 * time.Second, nil, 45 * time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, assumed := EvictionDeadline(t0, tc.podGrace, tc.maxGrace)
			if got.Sub(t0) != tc.want || assumed != tc.wantAssumed {
				t.Errorf("deadline = signal + %s (assumed %v), want + %s (%v)", got.Sub(t0), assumed, tc.want, tc.wantAssumed)
			}
		})
	}
}

// TestStateOf: libvirt's states as the agent counts them; only a stopped or crashed guest is gone.
func TestStateOf(t *testing.T) {
	for _, tc := range []struct {
		state  domain.State
		reason domain.Reason
		want   DomainState
		alive  bool
	}{
		{domain.Running, domain.ReasonUnknown, DomainRunning, true},
		{domain.Paused, domain.ReasonUnknown, DomainPaused, true},
		{domain.PMSuspended, domain.ReasonUnknown, DomainPMSuspended, true},
		{domain.ShuttingDown, domain.ReasonUnknown, DomainShuttingDown, true},
		{domain.Crashed, domain.ReasonUnknown, DomainCrashed, false},
		{domain.Shutoff, domain.ReasonCrashed, DomainCrashed, false},
		{domain.Shutoff, domain.ReasonUnknown, DomainShutoff, false},
	} {
		got := stateOf(tc.state, tc.reason)
		if got != tc.want || got.Alive() != tc.alive {
			t.Errorf("libvirt %s (%s): %s, alive %v; want %s, alive %v", tc.state, tc.reason, got, got.Alive(), tc.want, tc.alive)
		}
	}
}
