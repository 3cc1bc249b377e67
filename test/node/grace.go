package node

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

const (
	// minGracePeriod is the shortest grace period the kubelet ever gives a pod.
	minGracePeriod int64 = 1
	// hardEvictionGracePeriod is what a hard eviction threshold grants (the kubelet's
	// immediateEvictionGracePeriodSeconds).
	hardEvictionGracePeriod int64 = 1
	// lostPodGracePeriod is what processes get when their pod has left the API server
	// (force deletion) or been replaced under the same name.
	lostPodGracePeriod int64 = 1

	restartBackOffInitial = 10 * time.Second
	restartBackOffMax     = 5 * time.Minute
)

// effectiveGracePeriod is the kubelet's calculateEffectiveGracePeriod: the grace period for
// stopping pod, given the one already in force (0 if none). The API server's deletion grace
// period and an eviction's override may only shorten it; the pod's own setting applies when
// nothing else does; and it is never below one second.
func effectiveGracePeriod(current int64, pod *corev1.Pod, override *int64) int64 {
	grace := current
	overridden := false
	if d := pod.DeletionGracePeriodSeconds; d != nil && (grace == 0 || *d < grace) {
		grace, overridden = *d, true
	}
	if override != nil && (grace == 0 || *override < grace) {
		grace, overridden = *override, true
	}
	if !overridden && grace == 0 && pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	return max(grace, minGracePeriod)
}

// evictionGracePeriod is the grace period the kubelet's eviction manager grants pod: none for a
// hard threshold, otherwise evictionMaxPodGracePeriod capped by the pod's own
// terminationGracePeriodSeconds.
func evictionGracePeriod(maxPodGracePeriod int64, pod *corev1.Pod, hard bool) int64 {
	if hard {
		return hardEvictionGracePeriod
	}
	if tgps := pod.Spec.TerminationGracePeriodSeconds; tgps != nil {
		return min(maxPodGracePeriod, *tgps)
	}
	return maxPodGracePeriod
}

// shouldRestart says whether a container that exited with exitCode is started again.
func shouldRestart(policy corev1.RestartPolicy, exitCode int32) bool {
	switch policy {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return false
	}
}

// restartBackOff is how long the kubelet waits after a container's exit before starting it
// again, given how often it has been restarted: not at all the first time, then 10s doubling
// up to 5 minutes.
func restartBackOff(restartCount int32) time.Duration {
	if restartCount <= 0 {
		return 0
	}
	d := restartBackOffInitial
	for range restartCount - 1 {
		d *= 2
		if d >= restartBackOffMax {
			return restartBackOffMax
		}
	}
	return d
}

// nextRestart says whether the container described by status is to be started again under
// policy, and from when. A container waiting out its back-off carries its last exit in
// LastTerminationState.
func nextRestart(policy corev1.RestartPolicy, status corev1.ContainerStatus) (bool, time.Time) {
	exit := status.State.Terminated
	if status.State.Waiting != nil {
		exit = status.LastTerminationState.Terminated
	}
	if exit == nil || !shouldRestart(policy, exit.ExitCode) {
		return false, time.Time{}
	}
	return true, exit.FinishedAt.Add(restartBackOff(status.RestartCount))
}
