package vmi

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// HoldSourceGate says whether the readiness gates that go False, the source's at a migration's
// end, must wait, and for how long at most (less when a pod of vmi changes). They wait for every
// pod the guest runs in (the target) to have its gate True and its Ready condition True: a
// kubelet makes Ready follow the gate only when it next syncs the pod, and with the source not
// ready and the target not yet Ready the EndpointSlice controller publishes a slice with no ready
// endpoint, which the Service proxies answer by refusing connections (and the controller may take
// a second to publish again). A target whose kubelet has not followed its gate within
// KubeletFollowsGateWithin no longer holds the source: it must not stay an endpoint forever, and
// the source pod forwards to the target meanwhile.
func HoldSourceGate(vmi *v1alpha1.VirtualMachineInstance, pods []*corev1.Pod, now time.Time) (hold bool, wait time.Duration) {
	for _, pod := range pods {
		if !hasGuestGate(pod) || GuestRunningIn(vmi, pod) != corev1.ConditionTrue {
			continue
		}
		gate, ready := podCondition(pod, v1alpha1.PodConditionGuestRunning), podCondition(pod, corev1.PodReady)
		var left time.Duration
		switch {
		case gate == nil || gate.Status != corev1.ConditionTrue:
			left = KubeletFollowsGateWithin
		case ready != nil && ready.Status == corev1.ConditionTrue:
			continue
		default:
			if left = kubeletBoundLeft(gate, now); left <= 0 {
				continue
			}
		}
		hold, wait = true, max(wait, left)
	}
	return hold, wait
}

func hasGuestGate(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool {
		return g.ConditionType == v1alpha1.PodConditionGuestRunning
	})
}

// syncGuestGates sets the readiness gate of each of pods that has it, in GateOrder, holding
// those that go False as HoldSourceGate says; it says when to look again for a held one (0: none
// held), unless a pod changes first.
func (c *Controller) syncGuestGates(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pods []*corev1.Pod) (time.Duration, error) {
	// The pods as this sync leaves them: the target's gate written here counts for the source's.
	seen := GateOrder(vmi, pods)
	var again time.Duration
	for i, pod := range seen {
		if !hasGuestGate(pod) {
			continue
		}
		want := GuestRunningIn(vmi, pod)
		gate := podCondition(pod, v1alpha1.PodConditionGuestRunning)
		if gate != nil && gate.Status == want {
			continue
		}
		reason := "GuestRunning"
		if want != corev1.ConditionTrue {
			reason = "GuestNotHere"
			if gate != nil && gate.Status == corev1.ConditionTrue {
				if hold, wait := HoldSourceGate(vmi, seen, c.now().Time); hold {
					if wait > 0 && (again == 0 || wait < again) {
						again = wait
					}
					c.log.Info("holding the readiness gate of the pod the guest left until the target pod is Ready",
						"vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "atMost", wait)
					continue
				}
			}
		}
		// A strategic merge on the status: the conditions list merges by type, so the
		// kubelet's own conditions are left alone.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{{
			Type: v1alpha1.PodConditionGuestRunning, Status: want, Reason: reason, LastTransitionTime: c.now(),
		}}}})
		if err != nil {
			return again, err
		}
		patched, err := c.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		if err != nil {
			return again, fmt.Errorf("setting %s %s on pod %s: %w", v1alpha1.PodConditionGuestRunning, want, pod.Name, err)
		}
		seen[i] = patched
		c.log.Info("set the guest's readiness gate", "vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "status", want)
	}
	return again, nil
}

// ReasonSourcePodDeleted is the Event on a VMI whose former pod lifeboat deleted because its
// kubelet kept it Ready after the guest had left.
const ReasonSourcePodDeleted = "SourcePodDeleted"

// KubeletFollowsGateWithin is how long a kubelet may take to make a pod's Ready condition follow
// its readiness gate. A kubelet that is terminating the pod (an eviction, a node shutdown)
// re-reads the gate only once the pod's containers have ended: the pod it evicts for a migration
// stays a ready endpoint of the VM's Services, and its launcher waits for the agent, which waits
// for the pod to leave the Services (a circular wait that only the launcher's bound ends).
const KubeletFollowsGateWithin = 3 * time.Second

// kubeletBoundLeft is how long until KubeletFollowsGateWithin has surely passed since gate
// changed. The API keeps a condition's time in whole seconds, truncated: the gate changed within
// the second after, so the bound counts from there and lasts 3 to 4 s after the recorded time.
func kubeletBoundLeft(gate *corev1.PodCondition, now time.Time) time.Duration {
	return gate.LastTransitionTime.Truncate(time.Second).Add(time.Second + KubeletFollowsGateWithin).Sub(now)
}

// StillReadyWithoutGuest says whether pod, a launcher pod of vmi on the pod network, is one the
// guest has left for another node and whose kubelet has kept it Ready for KubeletFollowsGateWithin
// after its gate went False, counted as HoldSourceGate counts it: from the second after the gate's
// recorded time, which the API keeps in whole seconds (3 to 4 s after that time). Deleting it
// marks it terminating in the EndpointSlices, where a Service proxy with a ready endpoint (the
// target pod) no longer sends to it; nothing else about it changes, as its kubelet is ending it
// already. wait is how long until it would be, when it is not yet.
func StillReadyWithoutGuest(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, now time.Time) (remove bool, wait time.Duration) {
	if !hasGuestGate(pod) ||
		pod.DeletionTimestamp != nil || PodEnded(pod) ||
		vmi.Status.Phase != v1alpha1.VMIRunning || pod.Spec.NodeName == "" || pod.Spec.NodeName == vmi.Status.NodeName {
		return false, 0
	}
	gate, ready := podCondition(pod, v1alpha1.PodConditionGuestRunning), podCondition(pod, corev1.PodReady)
	if gate == nil || gate.Status != corev1.ConditionFalse || ready == nil || ready.Status != corev1.ConditionTrue {
		return false, 0
	}
	if left := kubeletBoundLeft(gate, now); left > 0 {
		return false, left
	}
	return true, 0
}

// deleteStillReadyWithoutGuest deletes the pods StillReadyWithoutGuest names, and says when to
// look again for those that are not yet (0: none).
func (c *Controller) deleteStillReadyWithoutGuest(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, pods []*corev1.Pod) (time.Duration, error) {
	var again time.Duration
	for _, pod := range pods {
		remove, wait := StillReadyWithoutGuest(vmi, pod, c.now().Time)
		if wait > 0 && (again == 0 || wait < again) {
			again = wait
		}
		if !remove {
			continue
		}
		err := c.kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return again, fmt.Errorf("deleting pod %s, which its kubelet keeps Ready after the guest left: %w", pod.Name, err)
		}
		c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonSourcePodDeleted,
			"deleted launcher pod %s, which the guest left for node %s: its kubelet kept it Ready for %s after its readiness gate went False (a kubelet ending a pod re-reads the gate only once its containers have stopped), so Services still sent to it",
			pod.Name, vmi.Status.NodeName, KubeletFollowsGateWithin)
		c.log.Info("deleted a launcher pod its kubelet keeps Ready after the guest left", "vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "node", pod.Spec.NodeName)
	}
	return again, nil
}
