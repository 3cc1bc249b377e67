package check

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipkg "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// What would happen to a VM if its node were drained or ran out of memory: the eviction strategy
// table of seed 000 (drains, through the eviction webhook and the VM's disruption budget) and of
// seed 001 (the kubelet's node-pressure eviction, behind the NodePressureEvictionLiveMigration
// gate), with what lifeboat adds (node-pressure relief, the kubelet's grace its agent published).
// `kubectl lifeboat status VM` prints it; Fate decides it from facts alone.

// Verdicts: the first word of a Fate.
const (
	VerdictMigrates  = "live-migrates"
	VerdictShutsDown = "shuts down"
	VerdictWaits     = "the drain waits"
	VerdictExternal  = "left to an external controller"
	VerdictLost      = "lost"
	VerdictUnknown   = "unknown"
	VerdictNothing   = "nothing happens"
)

// Fate is one outcome: a verdict and the sentences that say why, and what to do.
type Fate struct {
	Verdict string
	Why     string
}

func (f Fate) String() string { return f.Verdict + ": " + f.Why }

// VMFacts are what decides a VM's fate, read from the API (FactsOf reads them from objects).
type VMFacts struct {
	// Running: the VMI runs on Node.
	Running bool
	Node    string
	// Strategy is the eviction strategy in effect and StrategyFrom where it came from.
	Strategy     v1alpha1.EvictionStrategy
	StrategyFrom string
	// Migratable is the VMI's LiveMigratable condition (True); NotMigratable says why not, in
	// the agent's words, "" while the agent has not reported.
	Migratable    bool
	NotMigratable string
	// OtherNodes are the nodes besides Node that could take its target pod (placement.TargetNodes);
	// NoTarget says why none can, "" when some can. Selector is its nodeSelector, "" for none.
	OtherNodes []string
	NoTarget   string
	Selector   string
	// NodesUnknown: the nodes could not be read, so where it could go is not known.
	NodesUnknown bool
	// Memory is the guest's memory in bytes.
	Memory int64
	// PodGraceSeconds is its launcher pod's terminationGracePeriodSeconds (0: not known), the
	// other bound of a soft eviction's grace.
	PodGraceSeconds int64
}

// ClusterFacts are what the cluster adds.
type ClusterFacts struct {
	// Gate is the NodePressureEvictionLiveMigration feature gate.
	Gate bool
	// Webhook: the eviction webhook is registered with a CA bundle; WebhookKnown false when
	// that could not be read.
	Webhook, WebhookKnown bool
	// Bandwidth is spec.migrations.bandwidthPerMigration in bytes per second, 0 for no cap.
	Bandwidth int64
	// Margin is node-pressure relief's margin above the kubelet's threshold.
	Margin string
	// Exposure is what the VM's node's agent published (nil: nothing, or unreadable).
	Exposure *v1alpha1.NodeEvictionExposure
}

// Strategy origins.
const (
	FromVMI     = "the VMI's spec.evictionStrategy"
	FromConfig  = "the LifeboatConfig's spec.evictionStrategy, as the VMI sets none"
	FromDefault = "the default, as neither the VMI nor the LifeboatConfig sets one"
)

// StrategyOf is the VMI's eviction strategy in effect and where it comes from.
func StrategyOf(vmi *v1alpha1.VirtualMachineInstance, config *v1alpha1.LifeboatConfig) (v1alpha1.EvictionStrategy, string) {
	s := v1alpha1.EffectiveEvictionStrategy(vmi, config)
	switch {
	case vmi.Spec.EvictionStrategy != nil:
		return s, FromVMI
	case config != nil && config.Spec.EvictionStrategy != nil:
		return s, FromConfig
	}
	return s, FromDefault
}

// wantsMigration: the strategy asks for a live migration where one is possible.
func wantsMigration(s v1alpha1.EvictionStrategy) bool {
	return s == v1alpha1.EvictionStrategyLiveMigrate || s == v1alpha1.EvictionStrategyLiveMigrateIfPossible
}

// pinned says why the VM has nowhere to go, or "".
func (v VMFacts) pinned() string {
	if len(v.OtherNodes) > 0 || v.NodesUnknown {
		return ""
	}
	why := v.NoTarget
	if why == "" {
		why = "no other node can take it"
	}
	if v.Selector == "" {
		return fmt.Sprintf("%s; make one able to (kubectl label node NODE %s=true, uncordon, or tolerate its taints)", why, v1alpha1.LabelKVMNode)
	}
	return fmt.Sprintf("%s; remove or widen its nodeSelector %s, or make another node able to take it", why, v.Selector)
}

func (v VMFacts) notMigratable() string {
	if v.NotMigratable == "" {
		return "its agent has not said it can"
	}
	return v.NotMigratable
}

func (v VMFacts) targets() string {
	n := len(v.OtherNodes)
	if v.NodesUnknown {
		return "where it can go is not known here (the nodes could not be read)"
	}
	named := strings.Join(v.OtherNodes[:min(n, 3)], ", ")
	if n > 3 {
		named += ", …"
	}
	return fmt.Sprintf("%d other node(s) fit (%s)", n, named)
}

// IfDrained is what a drain of the VM's node (kubectl drain, the descheduler, the eviction API)
// would do to it: seed 000's table, as lifeboat's webhook and disruption budgets answer it.
func IfDrained(v VMFacts, c ClusterFacts) Fate {
	if !v.Running {
		return Fate{VerdictNothing, "the VM runs on no node"}
	}
	budget := v.Strategy == v1alpha1.EvictionStrategyLiveMigrate || v.Strategy == v1alpha1.EvictionStrategyExternal ||
		v.Strategy == v1alpha1.EvictionStrategyLiveMigrateIfPossible && v.Migratable
	if c.WebhookKnown && !c.Webhook {
		if budget {
			return Fate{VerdictWaits, "the eviction webhook is not registered, so nothing marks the VM, and its disruption budget refuses the eviction (429) for ever; kubectl lifeboat check says why the webhook is missing"}
		}
		return Fate{VerdictShutsDown, fmt.Sprintf("its eviction strategy is %s and it has no disruption budget: the eviction goes through and its guest is shut down", v.Strategy)}
	}
	switch v.Strategy {
	case v1alpha1.EvictionStrategyExternal:
		return Fate{VerdictExternal, "the eviction webhook marks it (429 to the drain) and an external controller must move or stop it; its disruption budget holds the pod, and the drain waits, until then"}
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible:
		if !v.Migratable {
			if v.Strategy == v1alpha1.EvictionStrategyLiveMigrate {
				return Fate{VerdictWaits, fmt.Sprintf("the eviction webhook refuses the eviction (429) for ever, since the VM cannot live-migrate (%s); make it migratable, or stop it, or set its eviction strategy to LiveMigrateIfPossible or None to let it shut down", v.notMigratable())}
			}
			return Fate{VerdictShutsDown, fmt.Sprintf("its strategy LiveMigrateIfPossible behaves as None since it cannot live-migrate (%s): the eviction goes through and its guest is shut down", v.notMigratable())}
		}
		if why := v.pinned(); why != "" {
			// The controller sets LiveMigratable=False (NoTargetNode), and the webhook and the
			// disruption budget answer as for any VM that cannot migrate.
			if v.Strategy == v1alpha1.EvictionStrategyLiveMigrate {
				return Fate{VerdictWaits, "the eviction webhook refuses the eviction (429) at once, naming why it cannot move, and keeps refusing until a node can take it: " + why}
			}
			return Fate{VerdictShutsDown, "its strategy LiveMigrateIfPossible behaves as None since no node can take it: the eviction goes through and its guest is shut down; " + why}
		}
		return Fate{VerdictMigrates, fmt.Sprintf("the eviction webhook marks it (429 \"Eviction triggered evacuation\", which kubectl drain retries) and it moves; %s; the drain ends once it has left", v.targets())}
	}
	return Fate{VerdictShutsDown, "its eviction strategy is None: the eviction goes through and its guest is shut down (its run strategy decides whether it starts again elsewhere)"}
}

// IfOutOfMemory is what the kubelet's node-pressure eviction would do to the VM, from what its
// node's agent published of the kubelet's settings: seed 001's shouldEvacuateVMI behind the
// feature gate, with node-pressure relief ahead of it.
func IfOutOfMemory(v VMFacts, c ClusterFacts) Fate {
	if !v.Running {
		return Fate{VerdictNothing, "the VM runs on no node"}
	}
	e := c.Exposure
	if e == nil {
		return Fate{VerdictUnknown, fmt.Sprintf("node %s's agent has published no eviction exposure (annotation %s): is an agent running there? kubectl lifeboat check", v.Node, v1alpha1.AnnotationEvictionExposure)}
	}
	if e.Threshold == "" {
		return Fate{VerdictLost, fmt.Sprintf("node %s's kubelet has no memory.available eviction threshold: the kernel's OOM killer acts instead, and nothing can move the VM first; give the kubelet evictionSoft memory.available (manifests/examples/kubelet-config.yaml)", v.Node)}
	}
	grace := time.Duration(e.GraceSeconds * float64(time.Second))
	if own := time.Duration(v.PodGraceSeconds) * time.Second; e.Threshold == "soft" && own > 0 && own < grace {
		// The agent published the grace of the node's largest VM's pod; this one's is shorter.
		grace = max(own, time.Second)
	}
	kubelet := fmt.Sprintf("the kubelet's %s memory.available threshold gives its pod %s", e.Threshold, grace)
	movable := wantsMigration(v.Strategy) && v.Migratable
	var relief string
	switch {
	case !e.Relief:
		relief = "node-pressure relief is off there"
	case !movable:
		relief = "node-pressure relief moves only VMs that would live-migrate, not this one"
	case v.pinned() != "":
		relief = "node-pressure relief would move it, but " + v.pinned()
	default:
		relief = fmt.Sprintf("node-pressure relief moves VMs off first, %s above the kubelet's threshold, this one among them if the kubelet would pick it", c.Margin)
	}
	switch {
	case v.Strategy == v1alpha1.EvictionStrategyNone:
		return Fate{VerdictShutsDown, fmt.Sprintf("its eviction strategy is None: %s to shut the guest down; %s", kubelet, relief)}
	case !c.Gate && v.Strategy == v1alpha1.EvictionStrategyExternal:
		return Fate{VerdictShutsDown, fmt.Sprintf("the %s feature gate is off, so nothing marks it: %s to shut the guest down", v1alpha1.FeatureGateNodePressureEvictionLiveMigration, kubelet)}
	case v.Strategy == v1alpha1.EvictionStrategyExternal:
		return Fate{VerdictExternal, fmt.Sprintf("it is marked, and an external controller has the grace to act: %s, then kills it", kubelet)}
	case !v.Migratable:
		return Fate{VerdictShutsDown, fmt.Sprintf("it cannot live-migrate (%s), and the kubelet heeds no disruption budget: %s to shut the guest down", v.notMigratable(), kubelet)}
	}
	need, assumed := migrationTime(v.Memory, c.Bandwidth)
	rate := fmt.Sprintf("at bandwidthPerMigration %s/s", resource.NewQuantity(c.Bandwidth, resource.BinarySI))
	if assumed {
		rate = "at an assumed 10 Gbit/s (no bandwidthPerMigration)"
	}
	copyOnce := fmt.Sprintf("copying its %s once takes at least %s %s", resource.NewQuantity(v.Memory, resource.BinarySI), need.Round(100*time.Millisecond), rate)
	reliefSaves := e.Relief && v.pinned() == ""
	switch {
	case !c.Gate:
		why := fmt.Sprintf("%s; if the kubelet evicts it, it shuts down, as the %s feature gate is off", relief, v1alpha1.FeatureGateNodePressureEvictionLiveMigration)
		if reliefSaves {
			return Fate{VerdictMigrates, why}
		}
		return Fate{VerdictShutsDown, why + "; turn the gate on in the LifeboatConfig"}
	case v.pinned() != "":
		return Fate{VerdictLost, fmt.Sprintf("it is marked when the kubelet evicts it, but no node can take it: %s; %s, then kills it", v.pinned(), kubelet)}
	case need <= grace:
		return Fate{VerdictMigrates, fmt.Sprintf("%s; if the kubelet evicts it, it live-migrates within the grace: %s, and %s", relief, kubelet, copyOnce)}
	case reliefSaves:
		return Fate{VerdictMigrates, fmt.Sprintf("%s; if the kubelet evicts it anyway, it is lost: %s, but %s", relief, kubelet, copyOnce)}
	}
	return Fate{VerdictLost, fmt.Sprintf("%s, but %s, and %s: turn relief on (spec.nodePressureRelief.enabled unset or true), or give the kubelet a longer evictionMaxPodGracePeriod", kubelet, copyOnce, relief)}
}

// FactsOf reads a VMI's facts; nodes are every Node, for where it could go (nil: they could not
// be read).
func FactsOf(vmi *v1alpha1.VirtualMachineInstance, config *v1alpha1.LifeboatConfig, nodes []corev1.Node) VMFacts {
	f := VMFacts{Running: active(vmi), Node: vmi.Status.NodeName, Memory: vmi.Spec.Memory.Value(), PodGraceSeconds: vmipkg.PodGracePeriodSeconds(vmi)}
	f.Strategy, f.StrategyFrom = StrategyOf(vmi, config)
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c != nil {
		f.Migratable = c.Status == metav1.ConditionTrue
		if !f.Migratable {
			f.NotMigratable = c.Reason + ": " + c.Message
		}
	}
	f.OtherNodes, f.NoTarget = otherNodes(vmi, nodes)
	f.NodesUnknown = nodes == nil
	if len(vmi.Spec.NodeSelector) > 0 {
		f.Selector = labels.Set(vmi.Spec.NodeSelector).String()
	}
	return f
}

// migrationTime is the least time one copy of memory takes: memory ÷ bandwidth, at 10 Gbit/s
// (assumed, and said so) without a cap, as the agents estimate it.
func migrationTime(memory, bandwidth int64) (time.Duration, bool) {
	const assumedLinkRate = 1250_000_000 // agent/pressure.AssumedLinkRate
	assumed := bandwidth <= 0
	if assumed {
		bandwidth = assumedLinkRate
	}
	return time.Duration(float64(memory) / float64(bandwidth) * float64(time.Second)), assumed
}
