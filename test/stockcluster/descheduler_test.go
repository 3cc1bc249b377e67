package stockcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// launcherPod is the VMI's running launcher pod on its node.
func (s *stock) launcherPod(t testing.TB, v *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	pods, err := s.cp.Kube.CoreV1().Pods(v.Namespace).List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIName + "=" + v.Name})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pods.Items {
		if p.Spec.NodeName == v.Status.NodeName && p.Status.Phase == corev1.PodRunning {
			return &pods.Items[i]
		}
	}
	t.Fatalf("no running launcher pod of %s on %s", v.Name, v.Status.NodeName)
	return nil
}

// evict asks the API to evict a pod, as the descheduler does; it returns the answer's code and message.
func (s *stock) evict(t testing.TB, pod *corev1.Pod) (int32, string) {
	t.Helper()
	err := s.cp.Kube.CoreV1().Pods(pod.Namespace).EvictV1(t.Context(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}})
	if err == nil {
		return 201, ""
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("evicting %s: %v", pod.Name, err)
	}
	return status.Status().Code, status.Status().Message
}

// testDescheduler plays the descheduler's protocol on a LiveMigrate VM: its launcher pod asks to
// be evicted only (request-evict-only), the eviction is answered 429 "Evacuation in progress"
// naming the VMI, the pod is annotated eviction-in-progress, and the VM moves to the other node.
func (s *stock) testDescheduler(t testing.TB) {
	ns := s.namespace(t, "descheduler")
	v := s.vm(t, ns, "vm", v1alpha1.EvictionStrategyLiveMigrate)
	v = s.waitVMI(t, ns, v.Name, bootTimeout, "Running and LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		ok, _ := v.LiveMigratable()
		return v.Status.Phase == v1alpha1.VMIRunning && ok
	})
	from := v.Status.NodeName
	pod := s.launcherPod(t, v)
	if _, ok := pod.Annotations[v1alpha1.AnnotationRequestEvictOnly]; !ok {
		t.Errorf("launcher pod %s lacks the descheduler's %s annotation", pod.Name, v1alpha1.AnnotationRequestEvictOnly)
	}
	want := fmt.Sprintf("%s %q", webhook.EvacuationText, ns+"/"+v.Name)
	// The descheduler retries a 429: the webhook's cache may not show the VM Running yet.
	var code int32
	var msg string
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		code, msg = s.evict(t, pod)
		if code != 429 {
			return false, fmt.Errorf("answered %d %q", code, msg)
		}
		return strings.Contains(msg, want), nil
	})
	if err != nil {
		t.Fatalf("the descheduler's eviction: last answer %d %q, want 429 containing %q: %v", code, msg, want, err)
	}
	t.Logf("the descheduler's eviction → %d %s", code, msg)
	if code, msg := s.evict(t, pod); code != 429 || !strings.Contains(msg, "Evacuation in progress") {
		t.Errorf("evicted again: got %d %q, want 429 Evacuation in progress", code, msg)
	}
	kubewait.For(t, 30*time.Second, "the source pod annotated "+v1alpha1.AnnotationEvictionInProgress, func(ctx context.Context) (*corev1.Pod, error) {
		return s.cp.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	}, func(p *corev1.Pod) bool {
		_, ok := p.Annotations[v1alpha1.AnnotationEvictionInProgress]
		return ok
	}, func(p *corev1.Pod) string { return fmt.Sprintf("%v", p.Annotations) })
	moved := s.waitVMI(t, ns, v.Name, 3*time.Minute, "moved off "+from, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMIRunning && v.Status.NodeName != from && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	if c := moved.Status.MigrationState.Cause; c != v1alpha1.MigrationCauseAPIEviction {
		t.Errorf("migration cause %s, want %s", c, v1alpha1.MigrationCauseAPIEviction)
	}
}
