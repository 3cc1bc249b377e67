package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func running(name string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

func exitedWith(name string, code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}

func waitingFor(name, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
}

func inBackOff(name string, code int32) corev1.ContainerStatus {
	s := waitingFor(name, reasonCrashLoopBackOff)
	s.LastTerminationState = exitedWith(name, code).State
	return s
}

func TestPodPhase(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   corev1.RestartPolicy
		statuses []corev1.ContainerStatus
		terminal bool
		want     corev1.PodPhase
	}{
		{"nothing known yet", corev1.RestartPolicyNever, nil, false, corev1.PodPending},
		{"a container being created", corev1.RestartPolicyNever, []corev1.ContainerStatus{running("a"), waitingFor("b", reasonContainerCreating)}, false, corev1.PodPending},
		{"all running", corev1.RestartPolicyNever, []corev1.ContainerStatus{running("a"), running("b")}, false, corev1.PodRunning},
		{"one running, one done", corev1.RestartPolicyNever, []corev1.ContainerStatus{running("a"), exitedWith("b", 0)}, false, corev1.PodRunning},
		{"Never, all succeeded", corev1.RestartPolicyNever, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 0)}, false, corev1.PodSucceeded},
		{"Never, one failed", corev1.RestartPolicyNever, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 3)}, false, corev1.PodFailed},
		{"Always, all exited, restarting", corev1.RestartPolicyAlways, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 0)}, false, corev1.PodRunning},
		{"Always, backing off", corev1.RestartPolicyAlways, []corev1.ContainerStatus{inBackOff("a", 1), inBackOff("b", 1)}, false, corev1.PodRunning},
		{"OnFailure, a failure restarting", corev1.RestartPolicyOnFailure, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 1)}, false, corev1.PodRunning},
		{"OnFailure, all succeeded", corev1.RestartPolicyOnFailure, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 0)}, false, corev1.PodSucceeded},
		{"stopped pod, Always, all succeeded", corev1.RestartPolicyAlways, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 0)}, true, corev1.PodSucceeded},
		{"stopped pod, Always, killed by SIGTERM", corev1.RestartPolicyAlways, []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 143)}, true, corev1.PodFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &corev1.PodSpec{RestartPolicy: tc.policy, Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}
			if got := podPhase(spec, tc.statuses, tc.terminal); got != tc.want {
				t.Errorf("podPhase = %s, want %s", got, tc.want)
			}
		})
	}
}
