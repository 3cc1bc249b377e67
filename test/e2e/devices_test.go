package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/deviceplugin"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
)

// lifeboat deployed from manifests/ on the real kubelet serves the node's VM devices through the
// kubelet's device plugin API: each device the node has appears in its allocatable with the
// agent's slots (none it lacks: this machine has no /dev/kvm), a pod that asks for one finds the
// device node in its container, and after the agent's pod is replaced, and again after the
// kubelet restarts (which removes every plugin's socket), its plugins register again, so the
// next pod gets the device too.
func TestDevicesReachPodsThroughTheRealKubelet(t *testing.T) {
	n := startRealNode(t)
	metrics := deployLifeboat(t, n)
	want := map[corev1.ResourceName]bool{}
	for _, d := range deviceplugin.Devices {
		want[corev1.ResourceName(d.Resource())] = deviceplugin.Present(d)
	}
	if !want[corev1.ResourceName(deviceplugin.Tun.Resource())] {
		t.Fatal("this machine has no /dev/net/tun: the test needs one device to hand out")
	}
	waitAllocatable(t, n, want)
	allowDevicePods(t, n)

	tun := deviceplugin.Tun
	runDevicePod(t, n, "tun-1", tun)
	pods, err := cluster.Kube.CoreV1().Pods("lifeboat-system").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lifeboat-agent"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want the one agent pod: %v %v", pods, err)
	}
	old := &pods.Items[0]
	if err := cluster.Kube.CoreV1().Pods("lifeboat-system").Delete(t.Context(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, old) // its metrics and its plugins' connections are gone with it
	waitReadyPod(t, "lifeboat-system", "app.kubernetes.io/name=lifeboat-agent", 2*time.Minute)
	waitRegistrations(t, metrics, tun, 1)
	waitAllocatable(t, n, want)
	runDevicePod(t, n, "tun-2", tun)

	if err := n.RestartKubelet(t.Context(), func(*kubeletv1beta1.KubeletConfiguration) {}); err != nil {
		t.Fatal(err)
	}
	waitRegistrations(t, metrics, tun, 2)
	waitAllocatable(t, n, want)
	runDevicePod(t, n, "tun-3", tun)
}

// waitRegistrations waits until the agent has registered d's plugin with the kubelet n times.
func waitRegistrations(t *testing.T, metrics string, d deviceplugin.Device, n float64) {
	t.Helper()
	sample := `lifeboat_agent_device_plugin_registrations_total{resource="` + d.Resource() + `"}`
	var got float64
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got = metricValue(t, metrics, sample)
		return got >= n, nil
	})
	if err != nil {
		t.Fatalf("want %s >= %v; it is %v", sample, n, got)
	}
}

// waitAllocatable waits until the node's allocatable holds each of lifeboat's devices it should
// (with the agent's default 110 slots) and none it should not.
func waitAllocatable(t *testing.T, n *realnode.Node, want map[corev1.ResourceName]bool) {
	t.Helper()
	var seen corev1.ResourceList
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := cluster.Kube.CoreV1().Nodes().Get(ctx, n.Name(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		seen = node.Status.Allocatable
		for name, present := range want {
			q, ok := seen[name]
			if present != (ok && q.Value() == 110) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("want lifeboat's devices in the node's allocatable as %v (110 slots each); it has %v", want, seen)
	}
}

// allowDevicePods takes away the binding of the policy lifeboat-launcher-devices, which lets only
// lifeboat's controller create pods that ask for devices: this test's pods are its own, not
// launchers (who may ask is TestOnlyLaunchersGetDevices's, in test/manifests). It waits until the
// API server, a moment behind, admits such a pod.
func allowDevicePods(t *testing.T, n *realnode.Node) {
	t.Helper()
	if err := cluster.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(t.Context(), "lifeboat-launcher-devices", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := devicePod(n, testNamespace(t), "probe", deviceplugin.Tun)
	var last error
	if wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = cluster.Kube.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	}) != nil {
		t.Fatalf("a pod asking for %s is still refused: %v", deviceplugin.Tun.Resource(), last)
	}
}

// runDevicePod runs a pod that asks for one d and checks that d's device node is in its container.
func runDevicePod(t *testing.T, n *realnode.Node, name string, d deviceplugin.Device) {
	t.Helper()
	ns := testNamespace(t)
	pod := devicePod(n, ns, name, d)
	if _, err := cluster.Kube.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var status corev1.PodStatus
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		status = p.Status
		return status.Phase == corev1.PodSucceeded || status.Phase == corev1.PodFailed, nil
	})
	if err != nil || status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s, asking for %s, should find %s in its container and succeed; it is %s (%s: %s, containers %+v)",
			name, d.Resource(), d.Path, status.Phase, status.Reason, status.Message, status.ContainerStatuses)
	}
}

// devicePod asks for one d on n and succeeds if d's device node is in its container.
func devicePod(n *realnode.Node, ns, name string, d deviceplugin.Device) *corev1.Pod {
	one := corev1.ResourceList{corev1.ResourceName(d.Resource()): resource.MustParse("1")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: n.Name(), RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true,
			Containers: []corev1.Container{{
				Name: "check", Image: images.Registry + "lifeboat-launcher:" + images.Tag, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/sh", "-c", "test -c " + d.Path},
				Resources:       corev1.ResourceRequirements{Limits: one, Requests: one},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
}
