package stockcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// uninstallCommand is the README's way to stop lifeboat and keep the VMs running.
const uninstallCommand = "kubectl delete -n lifeboat-system daemonset,deployment -l app.kubernetes.io/part-of=lifeboat"

// testUpgradeAndUninstall follows the README with a VM running: an upgrade (make push of a new
// tag, newTag in lifeboat-install/, the same apply command) replaces every lifeboat pod with the
// new images and leaves the VM's instance and launcher pod as they were; the uninstall that keeps
// the VMs (deleting the agents and the controllers) leaves them so too.
func (s *stock) testUpgradeAndUninstall(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), uninstallCommand) {
		t.Fatalf("the README no longer says to uninstall with %q, which this test runs", uninstallCommand)
	}
	ns := s.namespace(t, "lifecycle")
	s.vm(t, ns, "kept", v1alpha1.EvictionStrategyLiveMigrate)
	before := s.waitVMI(t, ns, "kept", bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.VMIRunning })
	pod := s.launcherPod(t, before)

	// The upgrade: a new tag pushed, set as newTag, applied again.
	overlay := filepath.Join(s.installDir, "lifeboat-install", "kustomization.yaml")
	b, err := os.ReadFile(overlay)
	if err != nil {
		t.Fatal(err)
	}
	old := installedTag(t, string(b))
	tag := old + "-next"
	if _, err := images.Push(t.Context(), s.registry+"/lifeboat", tag, os.Stderr); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(overlay, []byte(strings.ReplaceAll(string(b), "newTag: "+old, "newTag: "+tag)), 0o644); err != nil {
		t.Fatal(err)
	}
	s.shell(t, s.installDir, applyCommand, 5*time.Minute)
	for app, count := range map[string]int{"lifeboat-agent": 2, "lifeboat-controller": 1, "lifeboat-signer": 1} {
		kubewait.For(t, 5*time.Minute, fmt.Sprintf("%d Ready pods of %s, all with images tagged %s", count, app, tag), func(ctx context.Context) (*corev1.PodList, error) {
			return s.cp.Kube.CoreV1().Pods("lifeboat-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
		}, func(l *corev1.PodList) bool {
			ready := 0
			for _, p := range l.Items {
				if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) || p.DeletionTimestamp != nil {
					return false
				}
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			return ready == count
		}, podImages)
	}
	s.expectUntouched(t, before, pod, "after the upgrade")

	// The uninstall that keeps the VMs.
	s.shell(t, s.installDir, uninstallCommand, 2*time.Minute)
	kubewait.For(t, 2*time.Minute, "no pod of lifeboat's agents, controller or signer", func(ctx context.Context) (*corev1.PodList, error) {
		return s.cp.Kube.CoreV1().Pods("lifeboat-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=lifeboat"})
	}, func(l *corev1.PodList) bool { return len(l.Items) == 0 }, podImages)
	kubewait.Consistently(t, 10*time.Second, "the VM running as it was with lifeboat uninstalled", func(ctx context.Context) error {
		return s.untouched(ctx, before, pod)
	})
}

// expectUntouched fails unless the VMI is the same instance, Running on its node, with the same
// launcher pod running there, never restarted.
func (s *stock) expectUntouched(t *testing.T, before *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, when string) {
	t.Helper()
	if err := s.untouched(t.Context(), before, pod); err != nil {
		t.Errorf("%s: %v", when, err)
	}
}

func (s *stock) untouched(ctx context.Context, before *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) error {
	v, err := s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(before.Namespace).Get(ctx, before.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if v.UID != before.UID || v.Status.Phase != v1alpha1.VMIRunning || v.Status.NodeName != before.Status.NodeName {
		return fmt.Errorf("VMI %s is %s (uid %s) on %q, want the same instance %s Running on %s", v.Name, v.Status.Phase, v.UID, v.Status.NodeName, before.UID, before.Status.NodeName)
	}
	p, err := s.cp.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	restarts := int32(0)
	for _, c := range p.Status.ContainerStatuses {
		restarts += c.RestartCount
	}
	if p.UID != pod.UID || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || restarts > 0 {
		return fmt.Errorf("launcher pod %s is %s (uid %s, %d restarts, deleting: %v), want the same pod %s running, never restarted", p.Name, p.Status.Phase, p.UID, restarts, p.DeletionTimestamp != nil, pod.UID)
	}
	return nil
}

// installedTag is the newTag the install overlay gives lifeboat's images.
func installedTag(t *testing.T, overlay string) string {
	t.Helper()
	_, rest, ok := strings.Cut(overlay, "newTag: ")
	if !ok {
		t.Fatalf("no newTag in the install overlay:\n%s", overlay)
	}
	tag, _, _ := strings.Cut(rest, "}")
	return strings.TrimSpace(tag)
}

func podImages(l *corev1.PodList) string {
	var b strings.Builder
	for _, p := range l.Items {
		fmt.Fprintf(&b, "%s (%s, %s); ", p.Name, p.Spec.Containers[0].Image, p.Status.Phase)
	}
	return b.String()
}
