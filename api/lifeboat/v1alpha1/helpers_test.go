package v1alpha1

import "testing"

func TestEffectiveEvictionStrategy(t *testing.T) {
	live, external := EvictionStrategyLiveMigrate, EvictionStrategyExternal
	cases := []struct {
		name   string
		vmi    *EvictionStrategy
		config *LifeboatConfig
		want   EvictionStrategy
	}{
		{"the VMI's own wins", &live, &LifeboatConfig{Spec: LifeboatConfigSpec{EvictionStrategy: &external}}, EvictionStrategyLiveMigrate},
		{"else the cluster's", nil, &LifeboatConfig{Spec: LifeboatConfigSpec{EvictionStrategy: &external}}, EvictionStrategyExternal},
		{"else None", nil, &LifeboatConfig{}, EvictionStrategyNone},
		{"no config at all: None", nil, nil, EvictionStrategyNone},
	}
	for _, tc := range cases {
		vmi := &VirtualMachineInstance{Spec: VirtualMachineInstanceSpec{EvictionStrategy: tc.vmi}}
		if got := EffectiveEvictionStrategy(vmi, tc.config); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestFeatureGateEnabled(t *testing.T) {
	on := &LifeboatConfig{Spec: LifeboatConfigSpec{FeatureGates: []FeatureGate{FeatureGateNodePressureEvictionLiveMigration}}}
	if !FeatureGateEnabled(on, FeatureGateNodePressureEvictionLiveMigration) {
		t.Error("listed gate must be on")
	}
	if FeatureGateEnabled(&LifeboatConfig{}, FeatureGateNodePressureEvictionLiveMigration) || FeatureGateEnabled(nil, FeatureGateNodePressureEvictionLiveMigration) {
		t.Error("unlisted gate, or no config, must be off")
	}
}
