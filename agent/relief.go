package agent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// reliefInterval is how often the agent reads the node's memory for relief: more often than
// the kubelet's eviction manager (every 10 s), so relief acts before it does.
const reliefInterval = 2 * time.Second

// defaultReliefMargin is NodePressureReliefConfig.Margin's default, for a configuration written
// before the API server defaulted it.
var defaultReliefMargin = resource.MustParse("512Mi")

// runRelief moves VMs off the node before the kubelet has to evict them, while relief is on
// (pressure.Relieve decides).
func (a *Agent) runRelief(ctx context.Context) {
	wait.UntilWithContext(ctx, a.relieve, reliefInterval)
}

// Each round also publishes what the kubelet's settings mean for the node's VMs, as the VMs on
// the node and the LifeboatConfig change (exposure.go): relief left unset turns on where the
// kubelet's grace is too short.
func (a *Agent) relieve(ctx context.Context) {
	config := a.eviction().Config
	mem, err := a.cfg.Memory()
	if err != nil {
		a.cfg.Log.Warn("reading the node's memory for relief", "err", err)
		return
	}
	exposure := a.exposure(config, mem.Capacity)
	a.publishExposure(ctx, exposure)
	if !exposure.Relief {
		a.cfg.Metrics.ReliefLine.Set(0)
		a.labelRelieving(ctx, false)
		return
	}
	margin := defaultReliefMargin
	if config != nil && config.Spec.NodePressureRelief != nil && config.Spec.NodePressureRelief.Margin != nil {
		margin = *config.Spec.NodePressureRelief.Margin
	}
	vmis, pods := a.reliefCandidates(config)
	r := pressure.Relieve(mem, a.cfg.Thresholds, uint64(margin.Value()), pods)
	a.cfg.Metrics.ReliefLine.Set(float64(r.Line))
	// The label comes off a little above the line, so that a node hovering at it does not flap.
	switch {
	case r.Short > 0:
		a.labelRelieving(ctx, true)
	case r.Line == 0 || mem.Available() >= r.Line+uint64(margin.Value())/8:
		a.labelRelieving(ctx, false)
	}
	if len(r.Move) == 0 {
		return
	}
	a.cfg.Metrics.ReliefAvailable.Observe(float64(mem.Available()))
	why := fmt.Sprintf("memory.available on node %s is %s, within %s of the kubelet's eviction threshold %s",
		a.cfg.NodeName, quantity(mem.Available()), margin.String(), quantity(a.cfg.Thresholds.Acting().Of(mem.Capacity)))
	if !r.Enough {
		a.cfg.Metrics.ReliefDecisions.WithLabelValues("insufficient").Inc()
		why += fmt.Sprintf("; moving every VM that can move frees less than the %s needed", quantity(r.Short))
	}
	node := &corev1.ObjectReference{Kind: "Node", Name: a.cfg.NodeName, UID: types.UID(a.cfg.NodeName)}
	a.cfg.Recorder.Eventf(node, corev1.EventTypeWarning, string(v1alpha1.MigrationCauseNodePressureRelief), "%s: moving %d VM(s) away", why, len(r.Move))
	for _, p := range r.Move {
		vmi := vmis[p.Name]
		msg := fmt.Sprintf("%s: moving the VM (%s in use) before the kubelet has to evict it", why, quantity(p.Usage))
		// The cached VMI: a conflict means it changed since, and the next round looks again.
		v := vmi.DeepCopy()
		v1alpha1.MarkForEvacuation(&v.Status, v1alpha1.MigrationCauseNodePressureRelief, msg, metav1.NewTime(a.cfg.Now()))
		if _, err := a.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
			a.cfg.Log.Warn("marking a VM for node-pressure relief", "vmi", vmi.Namespace+"/"+vmi.Name, "err", err)
			continue
		}
		a.cfg.Metrics.ReliefDecisions.WithLabelValues("marked").Inc()
		a.cfg.Recorder.Event(vmi, corev1.EventTypeNormal, string(v1alpha1.MigrationCauseNodePressureRelief), msg)
		a.cfg.Log.Info("marked for node-pressure relief", "vmi", vmi.Namespace+"/"+vmi.Name, "memoryAvailable", mem.Available(), "usage", p.Usage)
	}
}

// labelRelieving sets or removes the node's LabelMemoryPressureRelief when it differs from what
// this agent last set (after a start: always, so a stale label from before goes).
func (a *Agent) labelRelieving(ctx context.Context, on bool) {
	if a.cfg.LabelNode == nil || a.relieving != nil && *a.relieving == on {
		return
	}
	if err := a.cfg.LabelNode(ctx, on); err != nil {
		a.cfg.Log.Warn("labelling the node for node-pressure relief", "relieving", on, "err", err)
		return
	}
	a.relieving = &on
	a.cfg.Log.Info("node-pressure relief label", "label", v1alpha1.LabelMemoryPressureRelief, "set", on)
}

// reliefCandidates are the running VMIs of the node as the kubelet's ranking sees their pods,
// by name: movable when their eviction strategy asks for a live migration and they can have
// one, moving when they are marked already or migrating.
func (a *Agent) reliefCandidates(config *v1alpha1.LifeboatConfig) (map[string]*v1alpha1.VirtualMachineInstance, []pressure.Pod) {
	vmis := map[string]*v1alpha1.VirtualMachineInstance{}
	var pods []pressure.Pod
	for _, obj := range a.informer.GetStore().List() {
		vmi, ok := obj.(*v1alpha1.VirtualMachineInstance)
		if !ok || vmi.Status.NodeName != a.cfg.NodeName || vmi.Status.Phase != v1alpha1.VMIRunning {
			continue
		}
		name := vmi.Namespace + "/" + vmi.Name
		vmis[name] = vmi
		migratable, _ := vmi.LiveMigratable()
		strategy := v1alpha1.EffectiveEvictionStrategy(vmi, config)
		p := pressure.Pod{
			Name: name,
			// The guest's memory, where the pod's own figure cannot be read.
			Usage:   uint64(vmi.Spec.Memory.Value()),
			Movable: migratable && (strategy == v1alpha1.EvictionStrategyLiveMigrate || strategy == v1alpha1.EvictionStrategyLiveMigrateIfPossible),
			Moving:  vmi.Status.EvacuationNodeName != "" || (vmi.Status.MigrationState != nil && !vmi.Status.MigrationState.Completed && !vmi.Status.MigrationState.Failed),
		}
		if pod := a.launcherPod(string(vmi.UID)); pod != nil {
			p.Request = uint64(pod.Spec.Containers[0].Resources.Requests.Memory().Value())
			if pod.Spec.Priority != nil {
				p.Priority = *pod.Spec.Priority
			}
			if a.cfg.PodWorkingSet != nil {
				if ws, ok := a.cfg.PodWorkingSet(string(pod.UID)); ok {
					p.Usage = ws
				}
			}
		}
		pods = append(pods, p)
	}
	return vmis, pods
}

// launcherPod is the running launcher pod of the VMI with uid on this node, nil if unknown.
func (a *Agent) launcherPod(uid string) *corev1.Pod {
	if a.cfg.PodInformer == nil {
		return nil
	}
	pod, ok := a.linkedPod(uid)
	if !ok || len(pod.Spec.Containers) == 0 {
		return nil
	}
	return pod
}

func quantity(bytes uint64) string {
	return resource.NewQuantity(int64(bytes), resource.BinarySI).String()
}
