package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// statusSummary is the part of a pod status a user reads, one line per condition and container.
type statusSummary struct {
	Phase, Reason, Message string
	Conditions             []string
	Containers             []string
}

func summarize(s corev1.PodStatus) statusSummary {
	sum := statusSummary{Phase: string(s.Phase), Reason: s.Reason, Message: s.Message}
	for _, c := range s.Conditions {
		sum.Conditions = append(sum.Conditions, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	for _, c := range s.ContainerStatuses {
		line := fmt.Sprintf("%s ready=%v started=%v restarts=%d ", c.Name, c.Ready, *c.Started, c.RestartCount)
		switch st := c.State; {
		case st.Running != nil:
			line += "running"
		case st.Waiting != nil:
			line += "waiting " + st.Waiting.Reason
		case st.Terminated != nil:
			line += fmt.Sprintf("terminated %d %s: %s", st.Terminated.ExitCode, st.Terminated.Reason, st.Terminated.Message)
		}
		sum.Containers = append(sum.Containers, line)
	}
	return sum
}

func TestGeneratePodStatus(t *testing.T) {
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	earlier := metav1.NewTime(now.Add(-time.Minute))
	pod := func(policy corev1.RestartPolicy, status corev1.PodStatus) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Generation: 1},
			Spec: corev1.PodSpec{
				RestartPolicy: policy,
				Containers:    []corev1.Container{{Name: "b"}, {Name: "a"}},
			},
			Status: status,
		}
	}
	scheduled := corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: earlier},
	}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		obs  observation
		want statusSummary
	}{{
		name: "just scheduled: nothing created yet",
		pod:  pod(corev1.RestartPolicyNever, scheduled),
		obs:  observation{},
		want: statusSummary{
			Phase: "Pending",
			Conditions: []string{
				"PodReadyToStartContainers=False PodSandboxNotReady: no pod sandbox exists",
				"Initialized=True : ",
				"Ready=False ContainersNotReady: containers with unready status: [b a]",
				"ContainersReady=False ContainersNotReady: containers with unready status: [b a]",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=false started=false restarts=0 waiting ContainerCreating",
				"b ready=false started=false restarts=0 waiting ContainerCreating",
			},
		},
	}, {
		name: "all running",
		pod:  pod(corev1.RestartPolicyNever, scheduled),
		obs:  observation{sandbox: sandboxReady, containers: []corev1.ContainerStatus{running("a"), running("b")}},
		want: statusSummary{
			Phase: "Running",
			Conditions: []string{
				"PodReadyToStartContainers=True : ",
				"Initialized=True : ",
				"Ready=True : ",
				"ContainersReady=True : ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=true started=true restarts=0 running",
				"b ready=true started=true restarts=0 running",
			},
		},
	}, {
		name: "Never, all done: Succeeded without a sandbox",
		pod:  pod(corev1.RestartPolicyNever, scheduled),
		obs:  observation{sandbox: sandboxStopped, terminal: true, containers: []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 0)}},
		want: statusSummary{
			Phase: "Succeeded",
			Conditions: []string{
				"PodReadyToStartContainers=False PodSandboxNotReady: pod sandbox is not ready",
				"Initialized=True PodCompleted: ",
				"Ready=False PodCompleted: ",
				"ContainersReady=False PodCompleted: ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=false started=false restarts=0 terminated 0 : ",
				"b ready=false started=false restarts=0 terminated 0 : ",
			},
		},
	}, {
		name: "stopped before a container was created: Failed, the container lost",
		pod:  pod(corev1.RestartPolicyAlways, scheduled),
		obs:  observation{sandbox: sandboxStopped, terminal: true, containers: []corev1.ContainerStatus{exitedWith("a", 143)}},
		want: statusSummary{
			Phase: "Failed",
			Conditions: []string{
				"PodReadyToStartContainers=False PodSandboxNotReady: pod sandbox is not ready",
				"Initialized=True : ",
				"Ready=False PodFailed: ",
				"ContainersReady=False PodFailed: ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=false started=false restarts=0 terminated 143 : ",
				"b ready=false started=false restarts=0 terminated 137 ContainerStatusUnknown: The container could not be located when the pod was terminated",
			},
		},
	}, {
		name: "evicted, still stopping: no sign in the status yet",
		pod:  pod(corev1.RestartPolicyNever, scheduled),
		obs: observation{sandbox: sandboxReady, eviction: &eviction{message: "low"},
			containers: []corev1.ContainerStatus{running("a"), running("b")}},
		want: statusSummary{
			Phase: "Running",
			Conditions: []string{
				"PodReadyToStartContainers=True : ",
				"Initialized=True : ",
				"Ready=True : ",
				"ContainersReady=True : ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=true started=true restarts=0 running",
				"b ready=true started=true restarts=0 running",
			},
		},
	}, {
		name: "evicted and stopped: Failed, Evicted, DisruptionTarget",
		pod:  pod(corev1.RestartPolicyNever, scheduled),
		obs: observation{sandbox: sandboxStopped, terminal: true, eviction: &eviction{message: "low"},
			containers: []corev1.ContainerStatus{exitedWith("a", 137), exitedWith("b", 143)}},
		want: statusSummary{
			Phase: "Failed", Reason: "Evicted", Message: "low",
			Conditions: []string{
				"DisruptionTarget=True TerminationByKubelet: low",
				"PodReadyToStartContainers=False PodSandboxNotReady: pod sandbox is not ready",
				"Initialized=True : ",
				"Ready=False PodFailed: ",
				"ContainersReady=False PodFailed: ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=false started=false restarts=0 terminated 137 : ",
				"b ready=false started=false restarts=0 terminated 143 : ",
			},
		},
	}, {
		name: "evicted, every container exited 0: Succeeded, the eviction only in DisruptionTarget",
		pod:  pod(corev1.RestartPolicyNever, scheduled),
		obs: observation{sandbox: sandboxStopped, terminal: true, eviction: &eviction{message: "low"},
			containers: []corev1.ContainerStatus{exitedWith("a", 0), exitedWith("b", 0)}},
		want: statusSummary{
			Phase: "Succeeded",
			Conditions: []string{
				"DisruptionTarget=True TerminationByKubelet: low",
				"PodReadyToStartContainers=False PodSandboxNotReady: pod sandbox is not ready",
				"Initialized=True PodCompleted: ",
				"Ready=False PodCompleted: ",
				"ContainersReady=False PodCompleted: ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=false started=false restarts=0 terminated 0 : ",
				"b ready=false started=false restarts=0 terminated 0 : ",
			},
		},
	}, {
		name: "conditions of others kept, readiness gate not met",
		pod: func() *corev1.Pod {
			p := pod(corev1.RestartPolicyNever, scheduled)
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/Ready"}}
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: "example.com/Ready", Status: corev1.ConditionFalse})
			return p
		}(),
		obs: observation{sandbox: sandboxReady, containers: []corev1.ContainerStatus{running("a"), running("b")}},
		want: statusSummary{
			Phase: "Running",
			Conditions: []string{
				"example.com/Ready=False : ",
				"PodReadyToStartContainers=True : ",
				"Initialized=True : ",
				`Ready=False ReadinessGatesNotReady: the status of pod readiness gate "example.com/Ready" is not "True", but False`,
				"ContainersReady=True : ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=true started=true restarts=0 running",
				"b ready=true started=true restarts=0 running",
			},
		},
	}, {
		name: "stopping: the readiness gate read as it was when the stop began",
		pod: func() *corev1.Pod {
			p := pod(corev1.RestartPolicyNever, scheduled)
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/Ready"}}
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: "example.com/Ready", Status: corev1.ConditionFalse})
			return p
		}(),
		obs: observation{sandbox: sandboxReady, containers: []corev1.ContainerStatus{running("a"), running("b")},
			stopping: true, atStop: []corev1.PodCondition{{Type: "example.com/Ready", Status: corev1.ConditionTrue}}},
		want: statusSummary{
			Phase: "Running",
			Conditions: []string{
				"example.com/Ready=False : ",
				"PodReadyToStartContainers=True : ",
				"Initialized=True : ",
				"Ready=True : ",
				"ContainersReady=True : ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=true started=true restarts=0 running",
				"b ready=true started=true restarts=0 running",
			},
		},
	}, {
		name: "a phase the API server has as terminal stays",
		pod:  pod(corev1.RestartPolicyNever, corev1.PodStatus{Phase: corev1.PodFailed, Reason: "InitContainersUnsupported", Message: "rejected"}),
		obs:  observation{sandbox: sandboxStopped, terminal: true},
		want: statusSummary{
			Phase: "Failed", Reason: "InitContainersUnsupported", Message: "rejected",
			Conditions: []string{
				"PodReadyToStartContainers=False PodSandboxNotReady: pod sandbox is not ready",
				"Initialized=True : ",
				"Ready=False PodFailed: ",
				"ContainersReady=False PodFailed: ",
				"PodScheduled=True : ",
			},
			Containers: []string{
				"a ready=false started=false restarts=0 terminated 137 ContainerStatusUnknown: The container could not be located when the pod was terminated",
				"b ready=false started=false restarts=0 terminated 137 ContainerStatusUnknown: The container could not be located when the pod was terminated",
			},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.obs.hostIP, tc.obs.now = "127.0.0.11", now
			got := generatePodStatus(tc.pod, tc.obs)
			if diff := cmp.Diff(tc.want, summarize(got)); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			if got.PodIP != "127.0.0.11" || got.HostIP != "127.0.0.11" || len(got.PodIPs) != 1 || len(got.HostIPs) != 1 {
				t.Errorf("pod IPs %v, host IPs %v: want the node's address", got.PodIPs, got.HostIPs)
			}
			if got.ObservedGeneration != 1 {
				t.Errorf("observedGeneration = %d, want the pod's generation 1", got.ObservedGeneration)
			}
		})
	}
}

func TestGeneratePodStatusTimes(t *testing.T) {
	now := time.Date(2026, 11, 22, 3, 0, 0, 500, time.UTC)
	earlier := metav1.NewTime(now.Add(-time.Minute))
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "a"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: earlier},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: earlier},
		}},
	}
	got := generatePodStatus(pod, observation{sandbox: sandboxReady, containers: []corev1.ContainerStatus{running("a")}, now: now})
	times := map[corev1.PodConditionType]metav1.Time{}
	for _, c := range got.Conditions {
		times[c.Type] = c.LastTransitionTime
	}
	truncated := metav1.NewTime(now.Truncate(time.Second))
	for _, tc := range []struct {
		name string
		typ  corev1.PodConditionType
		want metav1.Time
	}{
		{"unchanged status keeps its transition time", corev1.PodScheduled, earlier},
		{"changed status moves it to now", corev1.PodReady, truncated},
		{"new condition starts now", corev1.ContainersReady, truncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := times[tc.typ]; !got.Equal(&tc.want) {
				t.Errorf("%s lastTransitionTime = %s, want %s", tc.typ, got, tc.want)
			}
		})
	}
	if got.StartTime == nil || !got.StartTime.Equal(&truncated) {
		t.Errorf("startTime = %v, want %s, to the second as the API server keeps it", got.StartTime, truncated)
	}
}
