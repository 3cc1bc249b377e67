package vmi

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// GuestRunningIn says whether vmi's guest runs in pod, the value of the pod's readiness gate
// v1alpha1.PodConditionGuestRunning: the VMI runs, on the pod's node, and the pod is not done.
// A migration target becomes it when the VMI's node becomes the target's, at the end of the
// migration; the source stops being it at the same moment.
func GuestRunningIn(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) corev1.ConditionStatus {
	switch {
	case vmi.Status.Phase != v1alpha1.VMIRunning, pod.Spec.NodeName == "", pod.Spec.NodeName != vmi.Status.NodeName,
		pod.Status.Phase == corev1.PodSucceeded, pod.Status.Phase == corev1.PodFailed:
		return corev1.ConditionFalse
	}
	return corev1.ConditionTrue
}

// GateOrder is pods in the order their readiness gates are written: the pods the guest runs in
// first. At a migration's end the target becomes an endpoint of the VM's Services before the
// source stops being one; the other way round, the EndpointSlice controller can publish a slice
// with no ready endpoint in between, and the Service proxies then refuse connections.
func GateOrder(vmi *v1alpha1.VirtualMachineInstance, pods []*corev1.Pod) []*corev1.Pod {
	out := slices.Clone(pods)
	slices.SortStableFunc(out, func(a, b *corev1.Pod) int {
		ra, rb := GuestRunningIn(vmi, a) == corev1.ConditionTrue, GuestRunningIn(vmi, b) == corev1.ConditionTrue
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return 0
	})
	return out
}

// syncGuestGates sets the readiness gate of each of pods that has it, in GateOrder.
func (c *Controller) syncGuestGates(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pods []*corev1.Pod) error {
	for _, pod := range GateOrder(vmi, pods) {
		if !slices.ContainsFunc(pod.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool {
			return g.ConditionType == v1alpha1.PodConditionGuestRunning
		}) {
			continue
		}
		want := GuestRunningIn(vmi, pod)
		i := slices.IndexFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == v1alpha1.PodConditionGuestRunning })
		if i >= 0 && pod.Status.Conditions[i].Status == want {
			continue
		}
		reason := "GuestRunning"
		if want != corev1.ConditionTrue {
			reason = "GuestNotHere"
		}
		// A strategic merge on the status: the conditions list merges by type, so the
		// kubelet's own conditions are left alone.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{{
			Type: v1alpha1.PodConditionGuestRunning, Status: want, Reason: reason, LastTransitionTime: c.now(),
		}}}})
		if err != nil {
			return err
		}
		if _, err := c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("setting %s %s on pod %s: %w", v1alpha1.PodConditionGuestRunning, want, pod.Name, err)
		}
		c.log.Info("set the guest's readiness gate", "vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "status", want)
	}
	return nil
}
