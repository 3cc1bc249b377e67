package realnode

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

const probeImage = "lifeboat.dev/graceprobe:dev"

// startNode starts a real node for the test with the grace probe's image imported.
func startNode(t *testing.T) *Node {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "graceprobe.oci.tar")
	probe := GoImage{Name: probeImage, Package: "./test/cmd/lifeboat-graceprobe"}
	if err := probe.Build(t.Context(), root, archive); err != nil {
		t.Fatal(err)
	}
	n, err := Start(t.Context(), Config{
		Name: "real-1", Address: "127.0.0.31", Kubeconfig: cluster.Kubeconfig, Client: cluster.Kube,
		Images: []string{archive}, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log:\n%s", n.LogTail("kubelet"))
		}
		n.Stop()
	})
	return n
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// probePod runs the grace probe on the node, recording into dir on the host.
func probePod(node, name, dir string, memoryRequest string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](300),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers: []corev1.Container{{
				Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"--out=/probe/events"},
				VolumeMounts: []corev1.VolumeMount{{Name: "probe", MountPath: "/probe"}},
			}},
			Volumes: []corev1.Volume{{Name: "probe", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectory)},
			}}},
		},
	}
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memoryRequest)}
	return pod
}

// probeEvents reads what a grace probe recorded: the time of each event, by name, in order.
func probeEvents(t *testing.T, dir string) map[string][]time.Time {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "events"))
	if err != nil {
		return nil
	}
	defer f.Close()
	events := map[string][]time.Time{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, nanos, ok := strings.Cut(s.Text(), " ")
		if n, err := strconv.ParseInt(nanos, 10, 64); ok && err == nil {
			events[name] = append(events[name], time.Unix(0, n))
		}
	}
	return events
}

func waitPod(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return kubewait.For(t, timeout, fmt.Sprintf("pod %s/%s: %s", ns, name, what), func(ctx context.Context) (*corev1.Pod, error) {
		return cluster.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	}, cond, func(p *corev1.Pod) string {
		return fmt.Sprintf("phase %s reason %q message %q containers %+v", p.Status.Phase, p.Status.Reason, p.Status.Message, p.Status.ContainerStatuses)
	})
}

func podRunning(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

// TestSoftEvictionGivesTheChosenPodItsGracePeriod: a plain pod runs on the real node; when the
// node's memory.available falls below the kubelet's evictionSoft threshold for longer than
// evictionSoftGracePeriod, the kubelet's eviction manager picks the pod that uses memory beyond
// its request (not the one within its request), sends its container SIGTERM,
// and SIGKILLs it evictionMaxPodGracePeriod later (shorter than the pod's own 300 s); the pod
// ends Failed with reason Evicted.
func TestSoftEvictionGivesTheChosenPodItsGracePeriod(t *testing.T) {
	const maxGrace = 8
	node := startNode(t)
	ns := "default"
	victimDir, bystanderDir := t.TempDir(), t.TempDir()
	pods := cluster.Kube.CoreV1().Pods(ns)
	for _, p := range []*corev1.Pod{
		// Not BestEffort: a restarted kubelet re-admits its pods, and under memory pressure it
		// rejects BestEffort ones at once, with no grace period, instead of evicting them.
		probePod(node.Name(), "victim", victimDir, "1Mi"),
		probePod(node.Name(), "bystander", bystanderDir, "256Mi"),
	} {
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = pods.Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
	}
	for _, name := range []string{"victim", "bystander"} {
		p := waitPod(t, ns, name, 2*time.Minute, "Running on "+node.Name(), podRunning)
		if p.Spec.NodeName != node.Name() || p.Status.PodIP != node.Address() {
			t.Fatalf("pod %s runs on %q with IP %q, want %s with the node's address %s", name, p.Spec.NodeName, p.Status.PodIP, node.Name(), node.Address())
		}
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(probeEvents(t, victimDir)["beat"]) > 5, nil
	})
	if err != nil {
		t.Fatalf("the victim's container did not record heartbeats: %v", probeEvents(t, victimDir))
	}

	// Cross the soft threshold: set it above what is available now. The kubelet must be
	// restarted to read a new configuration; the pods keep running.
	available, threshold, err := node.CrossMemorySoftThreshold(t.Context(), 2<<30, func(c *kubeletv1beta1.KubeletConfiguration) {
		c.EvictionSoftGracePeriod = map[string]string{"memory.available": "5s"}
		c.EvictionMaxPodGracePeriod = maxGrace
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory.available %s; evictionSoft memory.available<%s", available, threshold)

	victim := waitPod(t, ns, "victim", 3*time.Minute, "phase Failed, reason Evicted", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted"
	})
	if !strings.Contains(victim.Status.Message, "memory") {
		t.Errorf("the eviction message should name the memory signal: %q", victim.Status.Message)
	}
	events := probeEvents(t, victimDir)
	if len(events["sigterm"]) != 1 {
		t.Fatalf("the victim's container must get exactly one SIGTERM; it recorded %d", len(events["sigterm"]))
	}
	sigterm, beats := events["sigterm"][0], events["beat"]
	seen := beats[len(beats)-1].Sub(sigterm)
	t.Logf("the container ran %s after its SIGTERM (evictionMaxPodGracePeriod %ds, pod's own 300s)", seen.Round(time.Millisecond), maxGrace)
	if seen < (maxGrace-1)*time.Second || seen > (maxGrace+2)*time.Second {
		t.Errorf("the container ran %s after SIGTERM, want about evictionMaxPodGracePeriod (%ds)", seen, maxGrace)
	}
	// The bystander, within its request, ranks after the victim: if the still-crossed threshold
	// makes the kubelet evict it too, that comes only after the victim is gone.
	if terms := probeEvents(t, bystanderDir)["sigterm"]; len(terms) > 0 && terms[0].Before(beats[len(beats)-1]) {
		t.Errorf("the bystander got SIGTERM at %s, before the victim was gone (%s)", terms[0], beats[len(beats)-1])
	}
}
