package node

import (
	corev1 "k8s.io/api/core/v1"
)

// podPhase is the kubelet's getPhase for a pod without init containers: the phase that the
// states of its containers imply. podIsTerminal means that nothing will run again for the pod
// (it is being deleted or evicted and its containers have stopped), so the restart policy no
// longer keeps it Running.
func podPhase(spec *corev1.PodSpec, statuses []corev1.ContainerStatus, podIsTerminal bool) corev1.PodPhase {
	var unknown, running, waiting, stopped, succeeded int
	for _, c := range spec.Containers {
		status, ok := findContainerStatus(statuses, c.Name)
		switch {
		case !ok:
			unknown++
		case status.State.Running != nil:
			running++
		case status.State.Terminated != nil:
			stopped++
			if status.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case status.State.Waiting != nil && status.LastTerminationState.Terminated != nil:
			// Waiting out a restart back-off: it has run and stopped.
			stopped++
		case status.State.Waiting != nil:
			waiting++
		default:
			unknown++
		}
	}

	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0 && unknown == 0:
		return corev1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		switch {
		case podIsTerminal && stopped == succeeded:
			return corev1.PodSucceeded
		case podIsTerminal:
			return corev1.PodFailed
		case spec.RestartPolicy == corev1.RestartPolicyAlways:
			return corev1.PodRunning
		case stopped == succeeded:
			return corev1.PodSucceeded
		case spec.RestartPolicy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		default:
			// OnFailure, with a failed container about to restart.
			return corev1.PodRunning
		}
	default:
		return corev1.PodPending
	}
}

func isTerminal(phase corev1.PodPhase) bool {
	return phase == corev1.PodSucceeded || phase == corev1.PodFailed
}

func findContainerStatus(statuses []corev1.ContainerStatus, name string) (corev1.ContainerStatus, bool) {
	for _, s := range statuses {
		if s.Name == name {
			return s, true
		}
	}
	return corev1.ContainerStatus{}, false
}
