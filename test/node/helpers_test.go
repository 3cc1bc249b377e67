package node

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// waitTimeout bounds every wait for the control plane and the node to react.
const waitTimeout = 60 * time.Second

// testBinaries are the commands test pods run; their scripts find other programs on PATH.
var testBinaries = map[string]string{"sh": "/bin/sh", "sleep": "/bin/sleep"}

// startNodes starts n nodes for the test with testBinaries, adjusted by configure.
func startNodes(t *testing.T, n int, configure ...func(*Config)) []*Node {
	t.Helper()
	withBinaries := func(c *Config) { c.Binaries = testBinaries }
	return StartN(t.Context(), t, cluster.Kube, n, append([]func(*Config){withBinaries}, configure...)...)
}

// testNamespace creates a namespace for the test and waits for its default service account,
// without which the API server refuses pods.
func testNamespace(t *testing.T) string { return cluster.Namespace(t, "node-") }

// shPod is a pod that runs script under sh on node. Its node selector names the node, but the
// real kube-scheduler still places it.
func shPod(node *Node, name, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node.Name()},
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   "emulated",
				Command: []string{"sh", "-c", script},
			}},
		},
	}
}

func createPod(t *testing.T, namespace string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := cluster.Kube.CoreV1().Pods(namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	return created
}

// waitForPod polls pod until cond holds, and fails the test with the pod's last status, saying
// what was expected, if it does not within waitTimeout.
func waitForPod(t *testing.T, namespace, name, expected string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return kubewait.For(t, waitTimeout, fmt.Sprintf("pod %s/%s: %s", namespace, name, expected), func(ctx context.Context) (*corev1.Pod, error) {
		return cluster.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}, cond, statusYAML)
}

// waitForPodGone waits until the pod object is deleted.
func waitForPodGone(t *testing.T, namespace, name string) {
	t.Helper()
	kubewait.Gone(t, waitTimeout, fmt.Sprintf("pod %s/%s", namespace, name), func(ctx context.Context) error {
		_, err := cluster.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		return err
	})
}

// waitForFile waits until path exists and returns its content.
func waitForFile(t *testing.T, path, expected string) string {
	t.Helper()
	var content []byte
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
		var err error
		content, err = os.ReadFile(path)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("expected %s: %s never appeared", expected, path)
	}
	return string(content)
}

// waitForLog waits until a container's log is want.
func waitForLog(t *testing.T, node *Node, pod *corev1.Pod, container, want string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
		log, err := node.ContainerLog(pod, container)
		last = log
		return err == nil && log == want, nil
	})
	if err != nil {
		t.Fatalf("log of container %s of pod %s: want %q, last read %q", container, pod.Name, want, last)
	}
}

func statusYAML(pod *corev1.Pod) string {
	if pod == nil {
		return "(never read)"
	}
	b, err := yaml.Marshal(pod.Status)
	if err != nil {
		return fmt.Sprintf("%+v", pod.Status)
	}
	return strings.TrimSpace(string(b))
}

func condition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func isReady(pod *corev1.Pod) bool {
	c := condition(pod, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

func hasPhase(phase corev1.PodPhase) func(*corev1.Pod) bool {
	return func(pod *corev1.Pod) bool { return pod.Status.Phase == phase }
}

// terminatedState is the end of the pod's only container, or nil.
func terminatedState(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	if len(pod.Status.ContainerStatuses) != 1 {
		return nil
	}
	return pod.Status.ContainerStatuses[0].State.Terminated
}
