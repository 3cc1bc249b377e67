package agent

import (
	"context"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Node Event reasons for what the kubelet's eviction settings mean for the node's VMs.
const (
	ReasonVMsAtRisk         = "VMsAtRisk"
	ReasonVMsNoLongerAtRisk = "VMsNoLongerAtRisk"
)

// exposure decides what the kubelet's eviction settings mean for the node's VMs now
// (pressure.Expose), on a node with capacity bytes of memory.
func (a *Agent) exposure(config *v1alpha1.LifeboatConfig, capacity uint64) pressure.Exposure {
	in := pressure.ExposureInput{
		Settings: pressure.KubeletSettings{Thresholds: a.cfg.Thresholds},
		Capacity: capacity,
		Evacuate: v1alpha1.FeatureGateEnabled(config, v1alpha1.FeatureGateNodePressureEvictionLiveMigration),
		Relief:   reliefMode(config),
		// Where the largest VM's pod is not seen, its grace is the kubelet's cap alone.
		PodGrace: time.Duration(math.MaxInt64),
	}
	if config != nil && config.Spec.Migrations.BandwidthPerMigration != nil {
		in.Bandwidth = uint64(max(config.Spec.Migrations.BandwidthPerMigration.Value(), 0))
	}
	var largest *v1alpha1.VirtualMachineInstance
	for _, obj := range a.informer.GetStore().List() {
		vmi, ok := obj.(*v1alpha1.VirtualMachineInstance)
		if !ok || vmi.Status.NodeName != a.cfg.NodeName || vmi.Status.Phase != v1alpha1.VMIRunning {
			continue
		}
		// Only a VM whose strategy asks for a live migration is saved by one.
		switch v1alpha1.EffectiveEvictionStrategy(vmi, config) {
		case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible:
		default:
			continue
		}
		if m := uint64(vmi.Spec.Memory.Value()); m > in.LargestVM {
			in.LargestVM, largest = m, vmi
		}
	}
	if largest != nil {
		if pod := a.launcherPod(string(largest.UID)); pod != nil && pod.Spec.TerminationGracePeriodSeconds != nil {
			in.PodGrace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
		}
	}
	if a.cfg.MaxPodGracePeriod != nil {
		in.Settings.MaxPodGracePeriod = *a.cfg.MaxPodGracePeriod
	} else {
		// Unknown: the pod's own grace is assumed, as for evacuation deadlines (EvictionDeadline).
		in.Settings.MaxPodGracePeriod = int64(min(in.PodGrace/time.Second, math.MaxInt32))
	}
	return pressure.Expose(in)
}

// reliefMode is the LifeboatConfig's spec.nodePressureRelief.enabled: unset is automatic.
func reliefMode(config *v1alpha1.LifeboatConfig) pressure.ReliefMode {
	if config == nil || config.Spec.NodePressureRelief == nil || config.Spec.NodePressureRelief.Enabled == nil {
		return pressure.ReliefAuto
	}
	if *config.Spec.NodePressureRelief.Enabled {
		return pressure.ReliefOn
	}
	return pressure.ReliefOff
}

// publishExposure tells the cluster what the exposure is when it changed: the Node's annotation
// (the source the controller's VMsAtRisk condition gathers), an Event on the Node when VMs come
// to be at risk or cease to be, and the metrics.
func (a *Agent) publishExposure(ctx context.Context, e pressure.Exposure) {
	pub := v1alpha1.NodeEvictionExposure{
		Source: a.cfg.KubeletSource, Threshold: e.First, GraceSeconds: e.Grace.Seconds(),
		LargestVMBytes: e.LargestVM, MigrationSeconds: e.Migration.Seconds(),
		Relief: e.Relief, AtRisk: e.AtRisk, Message: e.String(),
	}
	if a.cfg.KubeletSource == KubeletSourceDefaults {
		pub.Message = "the kubelet's configuration could not be read, so its upstream defaults are assumed: " + pub.Message
	}
	a.cfg.Metrics.exposure(e)
	if a.exposed != nil && *a.exposed == pub {
		return
	}
	if a.cfg.PublishExposure != nil {
		if err := a.cfg.PublishExposure(ctx, pub); err != nil {
			a.cfg.Log.Warn("publishing what the kubelet's eviction settings mean for the node's VMs", "err", err)
			return
		}
	}
	wasAtRisk := a.exposed != nil && a.exposed.AtRisk
	a.exposed = &pub
	a.cfg.Log.Info("the kubelet's eviction settings for the node's VMs", "source", pub.Source, "threshold", pub.Threshold,
		"graceSeconds", pub.GraceSeconds, "largestVM", pub.LargestVMBytes, "migrationSeconds", pub.MigrationSeconds,
		"relief", pub.Relief, "atRisk", pub.AtRisk, "message", pub.Message)
	node := &corev1.ObjectReference{Kind: "Node", Name: a.cfg.NodeName, UID: types.UID(a.cfg.NodeName)}
	switch {
	case pub.AtRisk && !wasAtRisk:
		a.cfg.Recorder.Event(node, corev1.EventTypeWarning, ReasonVMsAtRisk, pub.Message)
	case !pub.AtRisk && wasAtRisk:
		a.cfg.Recorder.Event(node, corev1.EventTypeNormal, ReasonVMsNoLongerAtRisk, pub.Message)
	}
}

// Where the agent's KubeletSource says the kubelet's settings came from.
const (
	KubeletSourceConfigz  = "configz"
	KubeletSourceFile     = "file"
	KubeletSourceDefaults = "defaults"
)
