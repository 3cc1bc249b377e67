package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// reasonInitContainersUnsupported is why the node refuses a pod with init containers.
const reasonInitContainersUnsupported = "InitContainersUnsupported"

// syncPod brings what runs for a pod and the pod's status in line with the pod's spec, the way
// the kubelet's pod worker does: a pod is admitted or rejected, runs, is stopped (deleted or
// evicted), and once nothing runs reports its terminal status; a deleted pod is then removed.
func (c *podController) syncPod(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // Not a key of ours: retrying cannot help.
	}
	now := time.Now()
	pod, err := c.pods.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		c.runtime.forget(key, now)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading pod %s from the cache: %w", key, err)
	}
	rec := c.runtime.record(pod, now)

	rejection := admissionRejection(pod, c.nodeName)
	switch {
	case isTerminal(pod.Status.Phase):
		return c.syncTerminal(ctx, pod, rec, now)
	case pod.DeletionTimestamp != nil || rec.evicting() != nil:
		return c.syncStopping(ctx, pod, rec, now)
	case rejection != "":
		return c.reject(ctx, pod, rejection)
	default:
		return c.syncRunning(ctx, pod, rec, now)
	}
}

// syncTerminal looks after a pod whose phase is final: nothing may run for it any more, and
// once it is deleted it is removed.
func (c *podController) syncTerminal(ctx context.Context, pod *corev1.Pod, rec *podRecord, now time.Time) error {
	if rec.running() {
		c.runtime.stop(pod, rec, effectiveGracePeriod(rec.stopping(), pod, nil), now)
		return nil
	}
	if pod.DeletionTimestamp != nil {
		return c.remove(ctx, pod)
	}
	return nil
}

// syncStopping stops the pod's containers and, once none runs, writes its terminal status and
// removes it if it was deleted. An evicted pod stays, Failed.
func (c *podController) syncStopping(ctx context.Context, pod *corev1.Pod, rec *podRecord, now time.Time) error {
	var override *int64
	if e := rec.evicting(); e != nil {
		override = ptr.To(e.gracePeriod)
	}
	atStop := rec.conditionsAtStop(pod)
	c.runtime.stop(pod, rec, effectiveGracePeriod(rec.stopping(), pod, override), now)
	terminal := !rec.running()
	if terminal {
		rec.finish()
	}
	obs := rec.observe()
	obs.terminal, obs.hostIP, obs.now = terminal, c.address, now
	obs.stopping, obs.atStop = true, atStop
	if err := c.writeStatus(ctx, pod, generatePodStatus(pod, obs)); err != nil {
		return err
	}
	if terminal && pod.DeletionTimestamp != nil {
		return c.remove(ctx, pod)
	}
	return nil
}

// syncRunning starts and restarts containers as the restart policy says and reports the pod's
// status. A pod whose containers are all done for good is finished.
func (c *podController) syncRunning(ctx context.Context, pod *corev1.Pod, rec *podRecord, now time.Time) error {
	nextRestart, startErr := c.runtime.startDue(pod, rec, now)
	obs := rec.observe()
	obs.hostIP, obs.now = c.address, now
	if isTerminal(podPhase(&pod.Spec, containerStatuses(pod, obs.containers, false), false)) {
		rec.finish()
		obs = rec.observe()
		obs.terminal, obs.hostIP, obs.now = true, c.address, now
	}
	if err := c.writeStatus(ctx, pod, generatePodStatus(pod, obs)); err != nil {
		return err
	}
	if startErr != nil {
		return startErr
	}
	if nextRestart > 0 {
		return requeueAfter(nextRestart)
	}
	return nil
}

// admissionRejection is why the node refuses to run pod, or "" if it runs it.
func admissionRejection(pod *corev1.Pod, nodeName string) string {
	if len(pod.Spec.InitContainers) == 0 {
		return ""
	}
	var names []string
	for _, c := range pod.Spec.InitContainers {
		names = append(names, c.Name)
	}
	return fmt.Sprintf("the emulated node %s does not run init containers (%s)", nodeName, strings.Join(names, ", "))
}

// reject fails a pod at admission, as the kubelet's rejectPod does.
func (c *podController) reject(ctx context.Context, pod *corev1.Pod, message string) error {
	c.recorder.Eventf(pod, corev1.EventTypeWarning, reasonInitContainersUnsupported, "%s", message)
	status := pod.Status.DeepCopy()
	status.Phase = corev1.PodFailed
	status.Reason = reasonInitContainersUnsupported
	status.Message = "Pod was rejected: " + message
	return c.writeStatus(ctx, pod, *status)
}

// writeStatus writes status if it differs from what the API server has. A conflict means the
// cache was behind; the sync is retried.
func (c *podController) writeStatus(ctx context.Context, pod *corev1.Pod, status corev1.PodStatus) error {
	if equality.Semantic.DeepEqual(pod.Status, status) {
		return nil
	}
	updated := pod.DeepCopy()
	updated.Status = status
	_, err := c.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil // Deleted meanwhile: the informer brings the news.
	}
	if err != nil {
		return fmt.Errorf("writing the status of pod %s: %w", klog.KObj(pod), err)
	}
	klog.FromContext(ctx).V(2).Info("Wrote pod status", "pod", klog.KObj(pod), "phase", status.Phase)
	return nil
}

// remove deletes a stopped pod for good, as the kubelet's status manager does once the pod's
// terminal status is written: grace period 0, and only this pod, not one recreated under its name.
func (c *podController) remove(ctx context.Context, pod *corev1.Pod) error {
	err := c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting pod %s: %w", klog.KObj(pod), err)
	}
	klog.FromContext(ctx).V(2).Info("Removed pod", "pod", klog.KObj(pod))
	return nil
}
