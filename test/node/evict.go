package node

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// EvictPod evicts a pod that runs on the node the way the kubelet's eviction manager does
// when memory.available crosses an eviction threshold, reporting the figures of
// Config.MemoryPressure:
//
//  1. a Warning event "Evicted" on the pod, with the kubelet's message and annotations;
//  2. SIGTERM to the pod's containers, and SIGKILL once the grace period is over: for a soft
//     threshold, the smaller of EvictionMaxPodGracePeriod and the pod's
//     terminationGracePeriodSeconds; for a hard one, none (the kubelet's minimum of one second);
//  3. once no container runs, the pod's final status: phase Failed, reason Evicted, the message,
//     and condition DisruptionTarget=True with reason TerminationByKubelet; when every container
//     exited 0 (a launcher whose guest left), phase Succeeded with the condition alone.
//
// EvictPod returns when the pod is terminal (or gone). The evicted pod is not deleted.
func (n *Node) EvictPod(ctx context.Context, namespace, name string) error {
	pod, err := n.pods.pods.Pods(namespace).Get(name)
	if err != nil {
		return fmt.Errorf("finding pod %s/%s on node %s: %w", namespace, name, n.cfg.Name, err)
	}
	if isTerminal(pod.Status.Phase) {
		return fmt.Errorf("pod %s is already %s: only active pods are evicted", klog.KObj(pod), pod.Status.Phase)
	}
	rec := n.pods.runtime.record(pod, time.Now())
	usage, err := rec.workingSets()
	if err != nil {
		return fmt.Errorf("measuring the memory of pod %s: %w", klog.KObj(pod), err)
	}
	pressure := n.cfg.MemoryPressure
	maps.Copy(usage, pressure.Usage)
	message, annotations := evictionMessage(pod, pressure.Threshold, pressure.Available, usage)
	grace := evictionGracePeriod(n.cfg.EvictionMaxPodGracePeriod, pod, pressure.Hard)

	n.recorder.AnnotatedEventf(pod, annotations, corev1.EventTypeWarning, reasonEvicted, "%s", message)
	n.cfg.Logger.Info("Evicting pod", "pod", klog.KObj(pod), "gracePeriod", grace, "message", message)
	rec.evict(&eviction{gracePeriod: grace, message: message})
	n.pods.queue.Add(podKey(pod))
	// The containers are killed when the grace period ends; the pod's status follows at once.
	return n.pods.waitTerminal(ctx, pod, time.Duration(grace)*time.Second+terminalAfterKill)
}

// terminalAfterKill bounds how long after its grace period an evicted pod takes to be terminal.
const terminalAfterKill = time.Minute

// waitTerminal waits, at most timeout, until pod is in a terminal phase or gone.
func (c *podController) waitTerminal(ctx context.Context, pod *corev1.Pod, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		current, err := c.pods.Pods(pod.Namespace).Get(pod.Name)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, err
		}
		return current.UID != pod.UID || isTerminal(current.Status.Phase), nil
	})
	if err != nil {
		return fmt.Errorf("waiting %s for evicted pod %s to be terminal (phase Succeeded or Failed) or gone: %w", timeout, klog.KObj(pod), err)
	}
	return nil
}
