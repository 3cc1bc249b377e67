// Package placement decides whether any node other than its own could take a VM's migration
// target, and why none can: the evacuation controller sets the VMI's LiveMigratable condition
// from it (reason NoTargetNode), the eviction webhook decides on it, and kubectl lifeboat check
// reports it. Pure functions of the VMI and the nodes.
package placement

import (
	"fmt"
	"maps"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	schedulingcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipkg "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// TargetNodes says which nodes other than source could take pod, a migration's target pod
// (vmipkg.TargetPlacement or vmipkg.NewTargetPod), as the scheduler's filters would see them
// with the node empty: VM nodes (labelled lifeboat.dev/kvm=true) that its node selector and
// required node affinity admit (short of memory or not: see withoutRelief), that are not cordoned, whose NoSchedule and NoExecute taints it
// tolerates (but for the node lifecycle's passing ones), and whose allocatable memory holds its memory request. What other pods already
// take is not counted: that changes by the minute, and a migration that finds a full cluster
// waits for room (the evacuation controller's AwaitingCapacity), whereas a node that fails here
// cannot take the VM until an admin changes it or the VM. When no node fits, why says what
// keeps each one out, in words an admin acts on; it is "" when some fit.
func TargetNodes(pod *corev1.Pod, source string, nodes []*corev1.Node) (fit []string, why string) {
	selector := maps.Clone(pod.Spec.NodeSelector)
	delete(selector, v1alpha1.LabelKVMNode)
	affinity := nodeaffinity.NewRequiredNodeAffinity(nil, pod.Spec.Affinity)
	request := podMemoryRequest(pod)

	var order []string            // reasons, in the order first met
	held := map[string][]string{} // reason → the nodes it keeps out
	keep := func(node, reason string) {
		if _, seen := held[reason]; !seen {
			order = append(order, reason)
		}
		held[reason] = append(held[reason], node)
	}
	const (
		notSelected = "do not match its nodeSelector"
		cordoned    = "are cordoned"
		notAffine   = "are excluded by its target pod's node affinity"
	)
	vmNodes := 0
	for _, n := range nodes {
		if n.Name == source || n.Labels[v1alpha1.LabelKVMNode] != "true" {
			continue
		}
		vmNodes++
		if !labels.SelectorFromSet(selector).Matches(labels.Set(n.Labels)) {
			keep(n.Name, notSelected)
			continue
		}
		if ok, _ := affinity.Match(withoutRelief(n)); !ok {
			keep(n.Name, notAffine)
			continue
		}
		if n.Spec.Unschedulable {
			keep(n.Name, cordoned)
			continue
		}
		if taint, untolerated := schedulingcorev1.FindMatchingUntoleratedTaint(logr.Discard(), n.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
			return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && !passing(t)
		}, false); untolerated {
			keep(n.Name, fmt.Sprintf("have taint %s, which the VM does not tolerate", taint.ToString()))
			continue
		}
		if allocatable, ok := n.Status.Allocatable[corev1.ResourceMemory]; ok && allocatable.Cmp(request) < 0 {
			keep(n.Name, fmt.Sprintf("have %s allocatable memory, less than the %s its pod requests", allocatable.String(), request.String()))
			continue
		}
		fit = append(fit, n.Name)
	}
	if len(fit) > 0 {
		return fit, ""
	}
	sel := labels.Set(selector).String()
	switch {
	case vmNodes == 0:
		return nil, fmt.Sprintf("no node other than %s is labelled %s=true", orNone(source), v1alpha1.LabelKVMNode)
	case len(order) == 1 && order[0] == notSelected:
		return nil, fmt.Sprintf("no other node labelled %s=true matches its nodeSelector %s", v1alpha1.LabelKVMNode, sel)
	}
	var parts []string
	for _, reason := range order {
		names := held[reason]
		if reason == notSelected {
			reason += " " + sel
		}
		parts = append(parts, nodeList(names)+" "+singular(reason, len(names)))
	}
	return nil, "no other node can take it: " + strings.Join(parts, "; ")
}

// passing says whether a taint is one the node lifecycle controller sets and clears from the
// node's conditions (node.kubernetes.io/not-ready, unreachable, memory-pressure, ...): a node
// rebooting or briefly short of something is no reason to give a VM up for good, any more than
// one short of memory (withoutRelief). A cordon (node.kubernetes.io/unschedulable) is an admin's
// act, and counts, as spec.unschedulable.
func passing(t *corev1.Taint) bool {
	switch t.Key {
	case corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable, corev1.TaintNodeMemoryPressure, corev1.TaintNodeDiskPressure,
		corev1.TaintNodePIDPressure, corev1.TaintNodeNetworkUnavailable:
		return true
	}
	return false
}

// withoutRelief is n without the node-pressure relief label, which target pods' affinity keeps
// them off: the label comes and goes with the node's free memory within minutes, and a node short
// of memory now is no reason to give a VM up for good (to shut a LiveMigrateIfPossible VM down at a
// drain). Its migration waits for the node instead, as for one that is full.
func withoutRelief(n *corev1.Node) *corev1.Node {
	if _, ok := n.Labels[v1alpha1.LabelMemoryPressureRelief]; !ok {
		return n
	}
	c := *n
	c.Labels = maps.Clone(n.Labels)
	delete(c.Labels, v1alpha1.LabelMemoryPressureRelief)
	return &c
}

// podMemoryRequest is the memory its containers request.
func podMemoryRequest(pod *corev1.Pod) (total resource.Quantity) {
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
			total.Add(q)
		}
	}
	return total
}

// nodeList names up to three nodes and counts the rest.
func nodeList(names []string) string {
	s := strings.Join(names[:min(len(names), 3)], ", ")
	if len(names) > 3 {
		s += fmt.Sprintf(" and %d more", len(names)-3)
	}
	return s
}

// singular makes a reason written for many nodes ("are cordoned") speak of one ("is cordoned").
func singular(reason string, n int) string {
	if n != 1 {
		return reason
	}
	for _, w := range [][2]string{{"are ", "is "}, {"do not ", "does not "}, {"have ", "has "}} {
		if r, ok := strings.CutPrefix(reason, w[0]); ok {
			return w[1] + r
		}
	}
	return reason
}

func orNone(node string) string {
	if node == "" {
		return "its own"
	}
	return node
}

// NoTargetNode says why no node other than its own could take the running VMI's target pod, or
// "" when one could (or the VMI runs on no node).
func NoTargetNode(vmi *v1alpha1.VirtualMachineInstance, nodes []*corev1.Node) string {
	if vmi.Status.NodeName == "" {
		return ""
	}
	_, why := TargetNodes(vmipkg.TargetPlacement(vmi), vmi.Status.NodeName, nodes)
	return why
}
