package soak

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestTheSameSeedReplaysTheSamePlan(t *testing.T) {
	for _, seed := range []uint64{1, 47, 1 << 40} {
		a, b := Plan(seed, time.Hour, 6, 3, DefaultPace), Plan(seed, time.Hour, 6, 3, DefaultPace)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("seed %d gave two plans", seed)
		}
	}
	if reflect.DeepEqual(Plan(1, time.Hour, 6, 3, DefaultPace), Plan(2, time.Hour, 6, 3, DefaultPace)) {
		t.Error("seeds 1 and 2 gave the same plan")
	}
}

// The short soak's plan, written out (make test runs seed 47 for three minutes): what a seed's
// soak does, step by step, is fixed by the seed alone (a change here changes every recorded
// soak's replay; docs name their seeds).
func TestAShortPlan(t *testing.T) {
	want := []string{
		"+10s vm-restart vm=1 node=0 for=0s value=0",
		"+23s config-postcopy vm=2 node=1 for=0s value=1",
		"+32s manual-migration vm=0 node=2 for=0s value=0",
		"+36s controller-kill vm=0 node=2 for=11s value=0",
		"+51s node-pressure-eviction vm=0 node=2 for=0s value=0",
		"+1m12s config-bandwidth vm=0 node=0 for=0s value=128",
		"+1m17s node-freeze vm=0 node=2 for=19s value=0",
		"+1m32s vm-restart vm=2 node=0 for=0s value=0",
		"+1m50s config-postcopy vm=2 node=2 for=0s value=1",
		"+2m5s eviction-request vm=0 node=1 for=0s value=0",
	}
	var got []string
	for _, s := range Plan(47, 3*time.Minute, 3, 3, DefaultPace) {
		got = append(got, s.String())
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("seed 47, 3 min:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestPlans(t *testing.T) {
	for _, tc := range []struct {
		name       string
		seed       uint64
		d          time.Duration
		vms, nodes int
	}{
		{"an hour on six VMs", 1, time.Hour, 6, 3},
		{"an hour on one VM", 2, time.Hour, 1, 3},
		{"ten minutes", 3, 10 * time.Minute, 3, 4},
		{"three minutes", 47, 3 * time.Minute, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := Plan(tc.seed, tc.d, tc.vms, tc.nodes, DefaultPace)
			if len(plan) == 0 {
				t.Fatal("an empty plan")
			}
			var faultEnds time.Duration
			var cordonedUntil time.Duration
			for i, s := range plan {
				if i > 0 && s.At < plan[i-1].At {
					t.Errorf("step %d (%s) before step %d (%s)", i, s, i-1, plan[i-1])
				}
				if s.VM < 0 || s.VM >= tc.vms || s.Node < 0 || s.Node >= tc.nodes {
					t.Errorf("step %s aims outside %d VMs and %d nodes", s, tc.vms, tc.nodes)
				}
				if s.Kind != Uncordon && s.At >= tc.d*3/4 {
					t.Errorf("step %s starts in the last quarter, which is left to settle", s)
				}
				if s.At+s.For > tc.d {
					t.Errorf("step %s ends after the soak", s)
				}
				if Faults[s.Kind] {
					if s.At < faultEnds {
						t.Errorf("fault %s starts before the last one ended at %s", s, faultEnds)
					}
					faultEnds = s.At + s.For
				}
				if s.Kind == Drain {
					if s.At < cordonedUntil {
						t.Errorf("drain %s while another node is cordoned until %s", s, cordonedUntil)
					}
					cordonedUntil = s.At + s.For
				}
			}
		})
	}
}

// An hour's plan does every kind of operation and fault.
func TestAnHoursPlanDoesEveryKind(t *testing.T) {
	seen := map[Kind]int{}
	for _, s := range Plan(1, time.Hour, 6, 3, DefaultPace) {
		seen[s.Kind]++
	}
	kinds := []Kind{EvictionRequest, NodeLost, NetworkCut, NetworkSlow, APIServerRestart, EtcdRestart}
	for _, w := range append(append([]weighted(nil), operations...), faults...) {
		kinds = append(kinds, w.kind)
	}
	for _, k := range kinds {
		if seen[k] == 0 {
			t.Errorf("no %s in an hour: %v", k, seen)
		}
	}
	if seen[Drain] != seen[Uncordon] {
		t.Errorf("%d drains and %d uncordons", seen[Drain], seen[Uncordon])
	}
	t.Logf("an hour: %v", seen)
}
