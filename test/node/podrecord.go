package node

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// podRecord is what the node knows about one pod.
type podRecord struct {
	key string
	uid types.UID

	mu         sync.Mutex
	containers map[string]*containerRecord // created containers, by name
	sandbox    sandboxState
	// gracePeriod is the one the pod is being stopped with, 0 while it is not.
	gracePeriod int64
	killAt      time.Time
	killTimer   *time.Timer
	eviction    *eviction
	// atStop are the pod's conditions when the node began to stop it (stopSeen).
	atStop   []corev1.PodCondition
	stopSeen bool
	// sandboxNet is the pod's network namespace and address; nil on the host's network.
	sandboxNet *podSandbox
}

type containerRecord struct {
	status corev1.ContainerStatus
	proc   *process // nil unless the container runs
}

// adoptedStatuses are the container statuses the node takes over for a pod it finds already
// started, by an earlier run of a node of the same name: ended containers keep their end, and
// those that were running are lost, as the kubelet reports containers its runtime no longer
// has. Taking them over keeps a pod with restartPolicy Never from running twice.
func adoptedStatuses(pod *corev1.Pod) []corev1.ContainerStatus {
	var adopted []corev1.ContainerStatus
	for _, s := range pod.Status.ContainerStatuses {
		s := *s.DeepCopy()
		switch {
		case s.State.Running != nil:
			s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137,
				Reason:   reasonContainerStatusUnknown,
				Message:  messageContainerNotLocated,
			}}
			s.RestartCount++
		case s.State.Terminated == nil && s.LastTerminationState.Terminated == nil:
			continue
		}
		adopted = append(adopted, s)
	}
	return adopted
}

// kill ends whatever still runs of the pod: the grace period is over.
func (rec *podRecord) kill() {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, cr := range rec.containers {
		if cr.proc != nil {
			cr.proc.signal(syscall.SIGKILL)
		}
	}
}

// observe snapshots what the status of the pod is made from.
func (rec *podRecord) observe() observation {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	obs := observation{sandbox: rec.sandbox, eviction: rec.eviction}
	if rec.sandboxNet != nil {
		obs.podIP = rec.sandboxNet.ip
	}
	for _, cr := range rec.containers {
		obs.containers = append(obs.containers, *cr.status.DeepCopy())
	}
	return obs
}

func (rec *podRecord) running() bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.runningLocked()
}

func (rec *podRecord) runningLocked() bool {
	for _, cr := range rec.containers {
		if cr.proc != nil {
			return true
		}
	}
	return false
}

// stopping reports the grace period the pod is being stopped with, 0 if it is not.
func (rec *podRecord) stopping() int64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.gracePeriod
}

// finish records that nothing will run for the pod again: the kubelet removes its sandbox.
func (rec *podRecord) finish() {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.sandbox == sandboxReady {
		rec.sandbox = sandboxStopped
	}
}

// conditionsAtStop returns pod's conditions as they were when the node began to stop it,
// recording pod's now the first time.
func (rec *podRecord) conditionsAtStop(pod *corev1.Pod) []corev1.PodCondition {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !rec.stopSeen {
		rec.atStop, rec.stopSeen = pod.Status.DeepCopy().Conditions, true
	}
	return rec.atStop
}

// evict records the eviction manager's decision; the first one stands.
func (rec *podRecord) evict(e *eviction) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.eviction == nil {
		rec.eviction = e
	}
}

func (rec *podRecord) evicting() *eviction {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.eviction
}

// workingSets measures the containers of the pod that run.
func (rec *podRecord) workingSets() (map[string]resource.Quantity, error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	usage := map[string]resource.Quantity{}
	for name, cr := range rec.containers {
		if cr.proc == nil {
			continue
		}
		bytes, err := workingSet(cr.proc.pid())
		if err != nil {
			return nil, fmt.Errorf("measuring container %s: %w", name, err)
		}
		usage[name] = *resource.NewQuantity(bytes, resource.BinarySI)
	}
	return usage, nil
}
