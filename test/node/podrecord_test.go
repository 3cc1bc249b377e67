package node

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func TestAdoptedStatuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  []corev1.ContainerStatus
		want []corev1.ContainerStatus
	}{{
		name: "a pod never started has nothing to adopt",
		api:  []corev1.ContainerStatus{waitingFor("a", reasonContainerCreating)},
	}, {
		name: "an ended container keeps its end",
		api:  []corev1.ContainerStatus{exitedWith("a", 3)},
		want: []corev1.ContainerStatus{exitedWith("a", 3)},
	}, {
		name: "a container backing off keeps its last end",
		api:  []corev1.ContainerStatus{inBackOff("a", 1)},
		want: []corev1.ContainerStatus{inBackOff("a", 1)},
	}, {
		name: "a running container was lost with the node's previous run",
		api:  []corev1.ContainerStatus{running("a")},
		want: []corev1.ContainerStatus{{Name: "a", RestartCount: 1, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 137, Reason: reasonContainerStatusUnknown, Message: messageContainerNotLocated,
		}}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := adoptedStatuses(&corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: tc.api}})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("adopted statuses (-want +got):\n%s", diff)
			}
		})
	}
}
