package migration

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// PostCopyTarget says whether a migration's target pod asks for a userfaultfd, which its QEMU
// needs to receive the guest in post-copy: when post-copy is allowed for the VM and every node the
// target could go to offers one. Asking for a device only some nodes have would narrow the
// target's choice to them, and a node-pressure evacuation whose target finds no room is a lost
// VM: post-copy is worth less than a place to go. nodes are the cluster's nodes; source is the
// VM's node.
func PostCopyTarget(allowed bool, nodes []*corev1.Node, source string) bool {
	if !allowed {
		return false
	}
	candidates := 0
	for _, n := range nodes {
		if n.Name == source || n.Labels[v1alpha1.LabelKVMNode] != "true" || n.Spec.Unschedulable {
			continue
		}
		if _, relieving := n.Labels[v1alpha1.LabelMemoryPressureRelief]; relieving {
			continue
		}
		if q, ok := n.Status.Allocatable[v1alpha1.DeviceUserFaultFD]; !ok || q.IsZero() {
			return false
		}
		candidates++
	}
	return candidates > 0
}
