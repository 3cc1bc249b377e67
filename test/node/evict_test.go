package node

import (
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

func TestEvictPod(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	const maxGrace = 3
	node := startNodes(t, 1, func(c *Config) {
		c.EvictionMaxPodGracePeriod = maxGrace
		c.MemoryPressure = MemoryPressure{
			Threshold: resource.MustParse("500Mi"),
			Available: resource.MustParse("300Mi"),
			Usage:     map[string]resource.Quantity{"launcher": resource.MustParse("900Mi")},
		}
	})[0]
	// The launcher's figure comes from the configuration; the helper's is measured.
	wantMessage := regexp.MustCompile(`^The node was low on resource: memory\. Threshold quantity: 500Mi, available: 300Mi\. ` +
		`Container launcher was using 900Mi, request is 128Mi, has larger consumption of memory\. ` +
		`Container helper was using \d+[KM]i, request is 0, has larger consumption of memory\. $`)

	for _, tc := range []struct {
		name      string
		podGrace  int64
		wantGrace time.Duration
	}{
		{"evictionMaxPodGracePeriod caps the pod's grace period", 30, maxGrace * time.Second},
		{"the pod's shorter grace period holds", 1, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			// The launcher records SIGTERM and carries on, so that only SIGKILL ends it.
			pod := shPod(node, "evict-"+map[int64]string{30: "capped", 1: "own"}[tc.podGrace],
				`trap 'echo TERM >> `+dir+`/term' TERM; touch `+dir+`/ready; while :; do sleep 0.1; done`)
			pod.Spec.TerminationGracePeriodSeconds = ptr.To(tc.podGrace)
			pod.Spec.Containers[0].Name = "launcher"
			pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "helper", Image: "emulated", Command: []string{"sleep", "3600"}})
			pod = createPod(t, ns, pod)
			waitForFile(t, filepath.Join(dir, "ready"), "the launcher's SIGTERM trap set")
			pod = waitForPod(t, ns, pod.Name, "Running and Ready", isReady)
			w, err := cluster.Kube.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{
				FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
				ResourceVersion: pod.ResourceVersion,
			})
			if err != nil {
				t.Fatalf("watching the pod: %v", err)
			}
			defer w.Stop()

			start := time.Now()
			if err := node.EvictPod(t.Context(), ns, pod.Name); err != nil {
				t.Fatalf("EvictPod: %v", err)
			}
			if elapsed := time.Since(start); elapsed < tc.wantGrace || elapsed > tc.wantGrace+5*time.Second {
				t.Errorf("the eviction took %s, want the %s grace period and a little", elapsed, tc.wantGrace)
			}

			pod, err = cluster.Kube.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the evicted pod must stay: %v", err)
			}
			if pod.Status.Phase != corev1.PodFailed || pod.Status.Reason != "Evicted" || !wantMessage.MatchString(pod.Status.Message) || pod.DeletionTimestamp != nil {
				t.Errorf("want phase Failed, reason Evicted, the kubelet's message, not deleted; got\n%s", statusYAML(pod))
			}
			dt := condition(pod, corev1.DisruptionTarget)
			if dt == nil || dt.Status != corev1.ConditionTrue || dt.Reason != corev1.PodReasonTerminationByKubelet || dt.Message != pod.Status.Message {
				t.Errorf("DisruptionTarget = %+v, want True, TerminationByKubelet, the eviction message", dt)
			}
			for _, cs := range pod.Status.ContainerStatuses {
				want := map[string]int32{"launcher": 137, "helper": 143}[cs.Name]
				if cs.State.Terminated == nil || cs.State.Terminated.ExitCode != want {
					t.Errorf("container %s: %+v, want terminated with %d", cs.Name, cs.State, want)
				}
			}
			if got := waitForFile(t, filepath.Join(dir, "term"), "the launcher's trap to record SIGTERM"); got != "TERM\n" {
				t.Errorf("the launcher's trap wrote %q, want one SIGTERM before the SIGKILL", got)
			}
			checkDisruptionTargetComesWithFailed(t, w)
			checkEvictedEvent(t, ns, pod.Name, wantMessage)
		})
	}
}

// checkDisruptionTargetComesWithFailed reads the pod's updates up to the terminal one: as with
// kubelet v1.37.1, the DisruptionTarget condition must not appear before the phase is Failed.
func checkDisruptionTargetComesWithFailed(t *testing.T, w watch.Interface) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended before the pod's terminal update")
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			if condition(pod, corev1.DisruptionTarget) != nil && pod.Status.Phase != corev1.PodFailed {
				t.Errorf("DisruptionTarget appeared while the pod was %s", pod.Status.Phase)
			}
			if pod.Status.Phase == corev1.PodFailed {
				return
			}
		case <-timeout:
			t.Fatalf("no terminal update of the pod within %s", waitTimeout)
		}
	}
}

// checkEvictedEvent waits for the kubelet's Warning event Evicted with its annotations.
func checkEvictedEvent(t *testing.T, namespace, pod string, wantMessage *regexp.Regexp) {
	t.Helper()
	var last []corev1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		events, err := cluster.Kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod, "reason": "Evicted"}.String(),
		})
		if err != nil {
			return false, nil
		}
		last = events.Items
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && wantMessage.MatchString(e.Message) && e.Source.Component == "kubelet" &&
				e.Annotations[offendingContainersKey] == "launcher,helper" && e.Annotations[starvedResourceKey] == "memory" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("expected a Warning event Evicted from the kubelet with the message and annotations; got %+v", last)
	}
}
