package node

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Reasons and messages the kubelet writes, verbatim.
const (
	reasonContainerCreating      = "ContainerCreating"
	reasonCompleted              = "Completed"
	reasonError                  = "Error"
	reasonStartError             = "StartError"
	reasonConfigError            = "CreateContainerConfigError"
	reasonCrashLoopBackOff       = "CrashLoopBackOff"
	reasonContainerStatusUnknown = "ContainerStatusUnknown"
	messageContainerNotLocated   = "The container could not be located when the pod was terminated"

	reasonPodCompleted           = "PodCompleted"
	reasonPodFailed              = "PodFailed"
	reasonContainersNotReady     = "ContainersNotReady"
	reasonReadinessGatesNotReady = "ReadinessGatesNotReady"
	reasonSandboxNotReady        = "PodSandboxNotReady"
	messageNoSandbox             = "no pod sandbox exists"
	messageSandboxNotReady       = "pod sandbox is not ready"

	reasonEvicted = "Evicted"
)

// sandboxState stands for the kubelet's pod sandbox: here, whether the pod's containers may run.
type sandboxState int

const (
	sandboxNone    sandboxState = iota // nothing was started for the pod yet
	sandboxReady                       // containers are started and restarted as needed
	sandboxStopped                     // the pod was stopped; nothing runs for it again
)

// observation is what the node knows of a pod when it reports the pod's status.
type observation struct {
	// containers are the statuses of the containers the node has created, in any order.
	containers []corev1.ContainerStatus
	sandbox    sandboxState
	// terminal: the pod was stopped (deleted or evicted) and none of its containers runs.
	terminal bool
	// stopping: the node is stopping the pod (deleted or evicted). Its readiness gates are then
	// read from atStop, the conditions the pod had when the node began to stop it: kubelet
	// v1.37.1 writes a terminating pod's status once as it begins (kubelet.go
	// SyncTerminatingPod), and its pod worker, waiting in killPod for the containers to end,
	// takes the next update of the pod only after that (pod_workers.go UpdatePod). Ready does
	// not follow a gate again before the containers have stopped, and then it is False.
	stopping bool
	atStop   []corev1.PodCondition
	// eviction is applied to the status once the pod is terminal.
	eviction *eviction
	// hostIP is the node's address, also the pod's on the host's network.
	hostIP string
	// podIP is the pod's own address on the pod network; empty on the host's network.
	podIP string
	now   time.Time
}

// eviction is the eviction manager's decision about a pod.
type eviction struct {
	gracePeriod int64
	message     string
}

// generatePodStatus is the status the kubelet would write for pod given obs: the kubelet's
// generateAPIPodStatus followed by its status manager's merge. Fields the kubelet does not own
// (QoS class, nominated node, conditions of other components) are kept from pod.
func generatePodStatus(pod *corev1.Pod, obs observation) corev1.PodStatus {
	now := metav1.NewTime(obs.now).Rfc3339Copy()
	status := *pod.Status.DeepCopy()
	status.ObservedGeneration = pod.Generation
	status.ContainerStatuses = containerStatuses(pod, obs.containers, obs.terminal)

	phase := podPhase(&pod.Spec, status.ContainerStatuses, obs.terminal)
	if obs.terminal && !isTerminal(phase) {
		// A stopped pod always ends in a terminal phase (status manager's TerminatePod).
		phase = corev1.PodFailed
	}
	if isTerminal(pod.Status.Phase) {
		// The API server refuses transitions out of a terminal phase.
		phase = pod.Status.Phase
	}
	if phase != pod.Status.Phase {
		// Reason and message belong to the phase they were written with.
		status.Reason, status.Message = "", ""
	}
	if obs.terminal && obs.eviction != nil && phase != corev1.PodSucceeded {
		// kubelet v1.37.1 takes an evicted pod's phase from its containers, as a real node shows:
		// when every container exited 0 the pod is Succeeded, and only the DisruptionTarget
		// condition tells of the eviction.
		phase, status.Reason, status.Message = corev1.PodFailed, reasonEvicted, obs.eviction.message
	}
	status.Phase = phase
	status.Conditions = podConditions(pod, &status, obs, now)

	status.HostIP, status.HostIPs = obs.hostIP, []corev1.HostIP{{IP: obs.hostIP}}
	podIP := obs.podIP
	if podIP == "" {
		podIP = obs.hostIP
	}
	status.PodIP, status.PodIPs = podIP, []corev1.PodIP{{IP: podIP}}
	if status.StartTime == nil {
		status.StartTime = &now
	}
	return status
}

// containerStatuses gives every container of pod a status, sorted by name as the kubelet
// writes them: what the node observed, ContainerCreating for containers not created yet, and
// once the pod is terminal, ContainerStatusUnknown for any container that did not end
// (status manager's TerminatePod).
func containerStatuses(pod *corev1.Pod, observed []corev1.ContainerStatus, terminal bool) []corev1.ContainerStatus {
	statuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		status, ok := findContainerStatus(observed, c.Name)
		if !ok {
			status = corev1.ContainerStatus{
				Name:  c.Name,
				Image: c.Image,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonContainerCreating}},
			}
		}
		status = *status.DeepCopy()
		if terminal && status.State.Terminated == nil {
			status.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137,
				Reason:   reasonContainerStatusUnknown,
				Message:  messageContainerNotLocated,
			}}
		}
		// Without probes, a running container has started and is ready (probe manager).
		running := status.State.Running != nil
		status.Started, status.Ready = ptr.To(running), running
		statuses = append(statuses, status)
	}
	slices.SortFunc(statuses, func(a, b corev1.ContainerStatus) int { return strings.Compare(a.Name, b.Name) })
	return statuses
}

// podConditions are the conditions of other components kept as they are, the DisruptionTarget
// of an eviction once the pod is terminal, and the conditions the kubelet owns, in the
// kubelet's order. Transition times move only when a condition's status changes.
func podConditions(pod *corev1.Pod, status *corev1.PodStatus, obs observation, now metav1.Time) []corev1.PodCondition {
	var conditions []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		if !ownedByKubelet(c.Type) {
			conditions = append(conditions, c)
		}
	}
	var ours []corev1.PodCondition
	if obs.terminal && obs.eviction != nil {
		conditions = slices.DeleteFunc(conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.DisruptionTarget })
		ours = append(ours, corev1.PodCondition{
			Type:    corev1.DisruptionTarget,
			Status:  corev1.ConditionTrue,
			Reason:  corev1.PodReasonTerminationByKubelet,
			Message: obs.eviction.message,
		})
	}
	containersReady := containersReadyCondition(pod, status.ContainerStatuses, status.Phase)
	gates := conditions
	if obs.stopping {
		gates = obs.atStop
	}
	ours = append(ours,
		readyToStartContainersCondition(obs.sandbox),
		initializedCondition(status.Phase),
		readyCondition(pod, containersReady, gates),
		containersReady,
		corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
	)
	for _, c := range ours {
		c.ObservedGeneration = pod.Generation
		c.LastTransitionTime = now
		for _, old := range pod.Status.Conditions {
			if old.Type == c.Type && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		conditions = append(conditions, c)
	}
	return conditions
}

// ownedByKubelet lists the conditions the kubelet regenerates on every status it writes.
func ownedByKubelet(t corev1.PodConditionType) bool {
	switch t {
	case corev1.PodScheduled, corev1.PodReady, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReadyToStartContainers:
		return true
	}
	return false
}

func readyToStartContainersCondition(sandbox sandboxState) corev1.PodCondition {
	c := corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, Reason: reasonSandboxNotReady}
	switch sandbox {
	case sandboxReady:
		return corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue}
	case sandboxStopped:
		c.Message = messageSandboxNotReady
	default:
		c.Message = messageNoSandbox
	}
	return c
}

// initializedCondition is always True: pods with init containers are rejected.
func initializedCondition(phase corev1.PodPhase) corev1.PodCondition {
	c := corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}
	if phase == corev1.PodSucceeded {
		c.Reason = reasonPodCompleted
	}
	return c
}

func containersReadyCondition(pod *corev1.Pod, statuses []corev1.ContainerStatus, phase corev1.PodPhase) corev1.PodCondition {
	switch phase {
	case corev1.PodSucceeded:
		return corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: reasonPodCompleted}
	case corev1.PodFailed:
		return corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: reasonPodFailed}
	}
	var unready []string
	for _, c := range pod.Spec.Containers {
		if s, _ := findContainerStatus(statuses, c.Name); !s.Ready {
			unready = append(unready, c.Name)
		}
	}
	if len(unready) > 0 {
		return corev1.PodCondition{
			Type:    corev1.ContainersReady,
			Status:  corev1.ConditionFalse,
			Reason:  reasonContainersNotReady,
			Message: fmt.Sprintf("containers with unready status: %s", unready),
		}
	}
	return corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue}
}

// readyCondition follows ContainersReady, then the pod's readiness gates, which are conditions
// other components set.
func readyCondition(pod *corev1.Pod, containersReady corev1.PodCondition, others []corev1.PodCondition) corev1.PodCondition {
	if containersReady.Status != corev1.ConditionTrue {
		return corev1.PodCondition{Type: corev1.PodReady, Status: containersReady.Status, Reason: containersReady.Reason, Message: containersReady.Message}
	}
	var unready []string
	for _, gate := range pod.Spec.ReadinessGates {
		i := slices.IndexFunc(others, func(c corev1.PodCondition) bool { return c.Type == gate.ConditionType })
		switch {
		case i < 0:
			unready = append(unready, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", gate.ConditionType))
		case others[i].Status != corev1.ConditionTrue:
			unready = append(unready, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", gate.ConditionType, others[i].Status))
		}
	}
	if len(unready) > 0 {
		return corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: reasonReadinessGatesNotReady, Message: strings.Join(unready, ", ")}
	}
	return corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
}
