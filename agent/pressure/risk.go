package pressure

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// hardEvictionGrace is what the kubelet gives a pod it evicts for a hard threshold
// (immediateEvictionGracePeriodSeconds in pkg/kubelet/eviction, v1.37.1), and the least it gives
// any evicted pod.
const hardEvictionGrace = time.Second

// TargetStart is the least time a migration takes before any memory moves: its target launcher
// pod is scheduled and started, and its QEMU made ready to receive. A VMI's creation to Running
// took 2.27 s (p50) under KVM on the development machine (docs/benchmarks.md, "VMI start-up");
// a target is as much work but the guest's boot. Without it, a kubelet's hard threshold (one
// second) would look long enough for a small VM, which no migration ever is.
const TargetStart = 2 * time.Second

// AssumedLinkRate is the transfer rate in bytes per second a migration without a bandwidth cap is
// assumed to reach (a 10 Gbit/s link): lifeboat cannot know the network, so the figure is said
// wherever it is used.
const AssumedLinkRate = 1250_000_000

// ReliefMode is the LifeboatConfig's choice for node-pressure relief.
type ReliefMode int

const (
	// ReliefAuto (the default) relieves a node where the kubelet's grace is too short for its
	// largest VM's migration.
	ReliefAuto ReliefMode = iota
	ReliefOn
	ReliefOff
)

// Exposure is what a node's kubelet eviction settings mean for the VMs on it.
type Exposure struct {
	// First is the memory.available threshold that acts first as memory runs out ("soft" or
	// "hard"), and FirstBytes its value; "" when the kubelet evicts nothing for memory.
	First      string
	FirstBytes uint64
	// Grace is how long the kubelet waits for a VM pod it evicts at First before killing it.
	Grace time.Duration
	// LargestVM is the memory of the node's largest VM that would migrate, 0 if none, and
	// Migration the least time moving it takes: TargetStart, then its memory at the bandwidth
	// (Assumed when that is AssumedLinkRate), as if the guest wrote nothing meanwhile.
	LargestVM uint64
	Migration time.Duration
	Assumed   bool
	// GraceSaves: the kubelet's eviction becomes a live migration (the feature gate) that can end
	// within Grace, or there is nothing to save (no threshold, no VM). Relief is whether relief
	// is on for the node.
	GraceSaves, Relief bool
	// AtRisk: the node has a VM that neither the grace nor relief can save.
	AtRisk bool
}

// ExposureInput is what Expose decides from.
type ExposureInput struct {
	Settings KubeletSettings
	// Capacity is the node's memory, for percentage thresholds.
	Capacity uint64
	// PodGrace is the largest VM's launcher pod terminationGracePeriodSeconds.
	PodGrace time.Duration
	// LargestVM is the memory of the largest VM on the node that would live-migrate, 0 if none.
	LargestVM uint64
	// Bandwidth is the LifeboatConfig's bandwidthPerMigration in bytes per second; 0: no cap.
	Bandwidth uint64
	// Evacuate is whether the NodePressureEvictionLiveMigration gate turns an eviction into a
	// live migration.
	Evacuate bool
	Relief   ReliefMode
}

// Expose decides what a node's kubelet settings mean for its VMs.
func Expose(in ExposureInput) Exposure {
	var e Exposure
	e.First, e.FirstBytes, e.Grace = firstThreshold(in.Settings, in.Capacity, in.PodGrace)
	e.LargestVM = in.LargestVM
	e.Migration, e.Assumed = migrationLowerBound(in.LargestVM, in.Bandwidth)
	e.GraceSaves = e.First == "" || in.LargestVM == 0 || in.Evacuate && e.Migration <= e.Grace
	e.Relief = in.Relief == ReliefOn || in.Relief == ReliefAuto && !e.GraceSaves
	e.AtRisk = !e.GraceSaves && !e.Relief
	return e
}

// firstThreshold is the memory.available threshold the kubelet reaches first as memory runs
// out (the higher in bytes; the hard one on a tie, as it acts at once), and the grace a pod
// evicted there gets: a hard threshold's second, or min(pod grace, evictionMaxPodGracePeriod)
// and at least that second for a soft one.
func firstThreshold(s KubeletSettings, capacity uint64, podGrace time.Duration) (string, uint64, time.Duration) {
	soft, hard := s.Soft.Of(capacity), s.Hard.Of(capacity)
	switch {
	case s.Soft.Set() && (!s.Hard.Set() || soft > hard):
		grace := min(podGrace, time.Duration(s.MaxPodGracePeriod)*time.Second)
		return "soft", soft, max(grace, hardEvictionGrace)
	case s.Hard.Set():
		return "hard", hard, hardEvictionGrace
	default:
		return "", 0, 0
	}
}

// migrationLowerBound is TargetStart plus memory ÷ bandwidth, with AssumedLinkRate (and assumed
// true) when bandwidth is 0.
func migrationLowerBound(memory, bandwidth uint64) (time.Duration, bool) {
	if memory == 0 {
		return 0, false
	}
	assumed := bandwidth == 0
	if assumed {
		bandwidth = AssumedLinkRate
	}
	return TargetStart + time.Duration(float64(memory)/float64(bandwidth)*float64(time.Second)), assumed
}

// String says what the exposure means for a person.
func (e Exposure) String() string {
	if e.First == "" {
		return "the kubelet has no memory.available eviction threshold: it evicts no VM for memory (the kernel's OOM killer may act instead)"
	}
	s := fmt.Sprintf("the kubelet's %s memory.available threshold (%s) acts first and gives an evicted VM pod %s",
		e.First, quantity(e.FirstBytes), e.Grace)
	if e.LargestVM == 0 {
		return s + "; no VM here would migrate"
	}
	rate := ""
	if e.Assumed {
		rate = ", assuming 10 Gbit/s with no bandwidthPerMigration"
	}
	s += fmt.Sprintf("; the largest VM (%s) needs at least %s to migrate%s", quantity(e.LargestVM), e.Migration.Round(100*time.Millisecond), rate)
	switch {
	case e.GraceSaves:
		s += ", which fits"
	case e.Migration <= e.Grace:
		s += ", which fits, but without the NodePressureEvictionLiveMigration gate an eviction shuts the VM down"
	default:
		s += ", which does not fit"
	}
	switch {
	case e.AtRisk:
		s += "; node-pressure relief is off: VMs here do not survive memory pressure"
	case e.Relief && !e.GraceSaves:
		s += "; node-pressure relief moves VMs before the kubelet acts"
	}
	return s
}

func quantity(bytes uint64) string {
	return resource.NewQuantity(int64(bytes), resource.BinarySI).String()
}
