package node

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// ContainerLog returns what the latest run of a container of pod wrote to its stdout and
// stderr, as `kubectl logs` shows it. It still works after the pod is gone.
func (n *Node) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	dir := n.layout.logDir(pod.Namespace, pod.Name, pod.UID, container)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("listing the logs of container %s of pod %s: %w", container, klog.KObj(pod), err)
	}
	latest := int32(-1)
	for _, e := range entries {
		if run, err := strconv.ParseInt(strings.TrimSuffix(e.Name(), ".log"), 10, 32); err == nil && int32(run) > latest {
			latest = int32(run)
		}
	}
	if latest < 0 {
		return "", fmt.Errorf("container %s of pod %s has no log in %s", container, klog.KObj(pod), dir)
	}
	b, err := os.ReadFile(n.layout.logPath(pod.Namespace, pod.Name, pod.UID, container, latest))
	if err != nil {
		return "", fmt.Errorf("reading the log of container %s of pod %s: %w", container, klog.KObj(pod), err)
	}
	return string(b), nil
}
