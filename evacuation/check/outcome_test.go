package check

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// The decision table of what a drain and memory pressure would do to a VM, by its eviction
// strategy, whether it can migrate and go somewhere, the feature gate, the webhook, the kubelet's
// grace and relief. Each row names its case; want is the verdict and words the reason must hold.
func TestFate(t *testing.T) {
	const gib = 1 << 30
	vm := func(s v1alpha1.EvictionStrategy) VMFacts {
		return VMFacts{Running: true, Node: "node-1", Strategy: s, Migratable: true, OtherNodes: []string{"node-2"}, Memory: gib}
	}
	notMigratable := func(v VMFacts) VMFacts {
		v.Migratable, v.NotMigratable = false, "DisksNotLiveMigratable: persistentVolumeClaim \"data\" is ReadWriteOnce"
		return v
	}
	pinned := func(v VMFacts) VMFacts {
		v.OtherNodes, v.Selector = nil, "disk=ssd"
		v.NoTarget = "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector disk=ssd"
		return v
	}
	// soft threshold, 30 s grace; relief off; 64Mi/s: a 1 GiB VM needs 16 s.
	exposure := func(grace float64, relief bool) *v1alpha1.NodeEvictionExposure {
		return &v1alpha1.NodeEvictionExposure{Source: "configz", Threshold: "soft", GraceSeconds: grace, Relief: relief}
	}
	cluster := ClusterFacts{Gate: true, Webhook: true, WebhookKnown: true, Bandwidth: 64 << 20, Margin: "512Mi", Exposure: exposure(30, false)}
	with := func(f func(*ClusterFacts)) ClusterFacts { c := cluster; f(&c); return c }
	noWebhook := with(func(c *ClusterFacts) { c.Webhook = false })
	gateOff := with(func(c *ClusterFacts) { c.Gate = false })
	shortGrace := with(func(c *ClusterFacts) { c.Exposure = exposure(1, false) })
	shortGraceRelief := with(func(c *ClusterFacts) { c.Exposure = exposure(1, true) })
	gateOffRelief := with(func(c *ClusterFacts) { c.Gate, c.Exposure = false, exposure(30, true) })
	noCap := with(func(c *ClusterFacts) { c.Bandwidth = 0; c.Exposure = exposure(1, false) })
	unpublished := with(func(c *ClusterFacts) { c.Exposure = nil })
	noThreshold := with(func(c *ClusterFacts) { c.Exposure = &v1alpha1.NodeEvictionExposure{Source: "file"} })

	lm, lmip, ext, none := v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible, v1alpha1.EvictionStrategyExternal, v1alpha1.EvictionStrategyNone
	for _, tc := range []struct {
		name       string
		vm         VMFacts
		cluster    ClusterFacts
		drain      string
		drainWords []string
		oom        string
		oomWords   []string
	}{
		{"None", vm(none), cluster, VerdictShutsDown, []string{"None"}, VerdictShutsDown, []string{"None", "30s"}},
		{"LiveMigrate, migratable, grace fits", vm(lm), cluster, VerdictMigrates, []string{"Eviction triggered evacuation", "1 other node(s) fit (node-2)"},
			VerdictMigrates, []string{"within the grace", "30s", "16s at bandwidthPerMigration 64Mi/s", "relief is off"}},
		{"LiveMigrate, not migratable", notMigratable(vm(lm)), cluster, VerdictWaits, []string{"429", "for ever", "ReadWriteOnce", "LiveMigrateIfPossible"},
			VerdictShutsDown, []string{"ReadWriteOnce", "no disruption budget"}},
		{"LiveMigrate, pinned", pinned(vm(lm)), cluster, VerdictWaits, []string{"429) at once", "matches its nodeSelector disk=ssd", "widen its nodeSelector disk=ssd"},
			VerdictLost, []string{"is marked", "matches its nodeSelector disk=ssd", "then kills it"}},
		{"LiveMigrateIfPossible, pinned", pinned(vm(lmip)), cluster, VerdictShutsDown, []string{"behaves as None", "matches its nodeSelector disk=ssd"},
			VerdictLost, []string{"is marked", "matches its nodeSelector disk=ssd"}},
		{"LiveMigrate, no other VM node", func() VMFacts { v := vm(lm); v.OtherNodes = nil; return v }(), cluster, VerdictWaits, []string{"kubectl label node NODE lifeboat.dev/kvm=true"},
			VerdictLost, []string{"no other node can take it"}},
		{"LiveMigrateIfPossible, migratable", vm(lmip), cluster, VerdictMigrates, nil, VerdictMigrates, []string{"within the grace"}},
		{"LiveMigrateIfPossible, not migratable", notMigratable(vm(lmip)), cluster, VerdictShutsDown, []string{"behaves as None", "ReadWriteOnce"},
			VerdictShutsDown, []string{"cannot live-migrate"}},
		{"LiveMigrateIfPossible, agent silent", func() VMFacts { v := vm(lmip); v.Migratable = false; return v }(), cluster, VerdictShutsDown, []string{"its agent has not said it can"},
			VerdictShutsDown, []string{"its agent has not said it can"}},
		{"External", vm(ext), cluster, VerdictExternal, []string{"external controller"}, VerdictExternal, []string{"external controller", "30s"}},
		{"External, gate off", vm(ext), gateOff, VerdictExternal, nil, VerdictShutsDown, []string{"NodePressureEvictionLiveMigration feature gate is off"}},
		{"webhook missing, LiveMigrate", vm(lm), noWebhook, VerdictWaits, []string{"not registered", "for ever"}, VerdictMigrates, nil},
		{"webhook missing, None", vm(none), noWebhook, VerdictShutsDown, []string{"no disruption budget"}, VerdictShutsDown, nil},
		{"webhook missing, LiveMigrateIfPossible not migratable", notMigratable(vm(lmip)), noWebhook, VerdictShutsDown, nil, VerdictShutsDown, nil},
		{"gate off, relief off", vm(lm), gateOff, VerdictMigrates, nil, VerdictShutsDown, []string{"feature gate is off", "turn the gate on"}},
		{"gate off, relief on", vm(lm), gateOffRelief, VerdictMigrates, nil, VerdictMigrates, []string{"relief moves VMs off first, 512Mi above", "shuts down"}},
		{"grace too short, relief off", vm(lm), shortGrace, VerdictMigrates, nil, VerdictLost, []string{"1s", "16s", "turn relief on"}},
		{"grace too short, relief on", vm(lm), shortGraceRelief, VerdictMigrates, nil, VerdictMigrates, []string{"relief moves VMs off first", "if the kubelet evicts it anyway, it is lost"}},
		{"relief on, not movable", vm(none), shortGraceRelief, VerdictShutsDown, nil, VerdictShutsDown, []string{"relief moves only VMs that would live-migrate"}},
		{"no bandwidth cap: 1 GiB fits 1s at 10 Gbit/s", vm(lm), noCap, VerdictMigrates, nil, VerdictMigrates, []string{"900ms at an assumed 10 Gbit/s"}},
		{"nothing published", vm(lm), unpublished, VerdictMigrates, nil, VerdictUnknown, []string{"lifeboat.dev/eviction-exposure", "kubectl lifeboat check"}},
		{"no memory threshold", vm(lm), noThreshold, VerdictMigrates, nil, VerdictLost, []string{"OOM killer"}},
		{"its own pod grace is shorter than the one published", func() VMFacts { v := vm(lm); v.PodGraceSeconds = 10; return v }(), cluster, VerdictMigrates, nil,
			VerdictLost, []string{"gives its pod 10s", "16s"}},
		{"its own pod grace is longer: the published one holds", func() VMFacts { v := vm(lm); v.PodGraceSeconds = 60; return v }(), cluster, VerdictMigrates, nil,
			VerdictMigrates, []string{"gives its pod 30s"}},
		{"nodes unreadable: where it goes is not known", func() VMFacts { v := vm(lm); v.OtherNodes, v.NodesUnknown = nil, true; return v }(), cluster,
			VerdictMigrates, []string{"where it can go is not known here"}, VerdictMigrates, nil},
		{"not running", VMFacts{Strategy: lm}, cluster, VerdictNothing, nil, VerdictNothing, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(what string, got Fate, verdict string, words []string) {
				t.Helper()
				if got.Verdict != verdict {
					t.Errorf("%s: %q, want verdict %q", what, got, verdict)
				}
				for _, w := range words {
					if !strings.Contains(got.Why, w) {
						t.Errorf("%s: %q does not say %q", what, got.Why, w)
					}
				}
			}
			check("drained", IfDrained(tc.vm, tc.cluster), tc.drain, tc.drainWords)
			check("out of memory", IfOutOfMemory(tc.vm, tc.cluster), tc.oom, tc.oomWords)
		})
	}
}

// FactsOf reads the strategy's origin, the LiveMigratable condition and where the VM could go.
func TestFactsOf(t *testing.T) {
	node := func(name string, l map[string]string, cordoned bool) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
	}
	kvm := func(extra ...string) map[string]string {
		l := map[string]string{v1alpha1.LabelKVMNode: "true"}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	nodes := []corev1.Node{node("a", kvm("disk", "ssd"), false), node("b", kvm(), false), node("c", kvm("disk", "ssd"), true), node("d", nil, false)}
	vmi := &v1alpha1.VirtualMachineInstance{
		Spec: v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse("1Gi"), NodeSelector: map[string]string{"disk": "ssd"}},
		Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.VMIRunning, NodeName: "a", Conditions: []metav1.Condition{
			{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: "LocalDisk", Message: "boot.disk is a node file"}}},
	}
	config := &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate)}}
	f := FactsOf(vmi, config, nodes)
	if !f.Running || f.Node != "a" || f.Strategy != v1alpha1.EvictionStrategyLiveMigrate || f.StrategyFrom != FromConfig ||
		f.Migratable || f.NotMigratable != "LocalDisk: boot.disk is a node file" || len(f.OtherNodes) != 0 || f.Selector != "disk=ssd" || f.Memory != 1<<30 {
		t.Errorf("FactsOf = %+v", f)
	}
	if f.PodGraceSeconds != 45 {
		t.Errorf("FactsOf: pod grace %ds, want the default 30s + 15s", f.PodGraceSeconds)
	}
	vmi.Spec.NodeSelector = nil
	vmi.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyNone)
	if f := FactsOf(vmi, config, nodes); f.StrategyFrom != FromVMI || f.Strategy != v1alpha1.EvictionStrategyNone || len(f.OtherNodes) != 1 || f.OtherNodes[0] != "b" {
		t.Errorf("FactsOf without a selector = %+v", f)
	}
	if s, from := StrategyOf(&v1alpha1.VirtualMachineInstance{}, nil); s != v1alpha1.EvictionStrategyNone || from != FromDefault {
		t.Errorf("StrategyOf with nothing set = %s, %s", s, from)
	}
}
