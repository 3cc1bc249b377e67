package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// A migrated VM's source pod and the VM's Service. These tests run lifeboat's VMI controller
// against the real control plane, whose EndpointSlice controller builds the Service's slices,
// with nodes that have no kubelet: the test plays the agents (the VMI moves to the target's
// node) and both kubelets, the target's following its pod's readiness gate and the source's
// either following it or, as a kubelet that is evicting the pod does, keeping the pod Ready
// until its containers end. It reads the slices as the source agent does before it ends the
// source pod's forward (agent.SourceListed).

// The source's kubelet is evicting its pod: the pod stays Ready after its gate went False, and
// lifeboat deletes it, which takes it out of the Service while the target is ready.
func TestAnEvictedSourcePodLeavesTheServiceOnceTheTargetIsReady(t *testing.T) {
	s := migratedServedVM(t, "ep-evict", false)
	kubewait.For(t, vmi.KubeletFollowsGateWithin+5*time.Second, "the source pod deleted", func(ctx context.Context) (*corev1.Pod, error) {
		return cluster.Kube.CoreV1().Pods(s.ns).Get(ctx, s.source.Name, metav1.GetOptions{})
	}, func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil }, func(p *corev1.Pod) string { return fmt.Sprintf("%+v", p.Status.Conditions) })
	t.Logf("the source pod was seen deleted %s after the target was a ready endpoint", time.Since(s.targetReady).Round(time.Millisecond))
	gone := s.waitUnlisted(t, vmi.KubeletFollowsGateWithin+5*time.Second)
	t.Logf("the source agent would see the source pod gone from the Service %s after the target was a ready endpoint, and end its forward %s later",
		gone.Sub(s.targetReady).Round(time.Millisecond), agent.ForwardAfterEndpoints)
	kubewait.Event(t, cluster.Kube, s.ns, fields.Set{"involvedObject.uid": string(s.vmi.UID), "reason": vmi.ReasonSourcePodDeleted}, 10*time.Second)
}

// The source's kubelet follows the gate, as it does for a pod it is not ending: the pod leaves
// the Service by itself and is left alone.
func TestASourcePodWhoseKubeletFollowsTheGateIsNotDeleted(t *testing.T) {
	s := migratedServedVM(t, "ep-follow", true)
	s.waitUnlisted(t, 10*time.Second)
	kubewait.Consistently(t, vmi.KubeletFollowsGateWithin+3*time.Second, "the source pod to stay", func(ctx context.Context) error {
		p, err := cluster.Kube.CoreV1().Pods(s.ns).Get(ctx, s.source.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.DeletionTimestamp != nil {
			return fmt.Errorf("the source pod %s was deleted although its kubelet made it unready", p.Name)
		}
		return nil
	})
}

// servedVM is a VM with a Service that has migrated from source to target.
type servedVM struct {
	ns             string
	vmi            *v1alpha1.VirtualMachineInstance
	source, target *corev1.Pod
	// targetReady is when the test saw the target a ready endpoint.
	targetReady time.Time
}

// migratedServedVM runs a VM on the pod network with a Service, on one of two kubelet-less
// nodes, and moves it to the other as a migration does, up to the target pod's being a ready
// endpoint. sourceFollows says whether the source's kubelet makes its pod's Ready follow the gate.
func migratedServedVM(t *testing.T, prefix string, sourceFollows bool) *servedVM {
	t.Helper()
	s, targetNode := servedVMWithTarget(t, prefix)
	s.moveTo(t, targetNode)
	waitGate(t, s.target, corev1.ConditionTrue)
	playKubelet(t, s.target, "10.250.0.2", true)
	waitGate(t, s.source, corev1.ConditionFalse)
	if sourceFollows {
		playKubelet(t, s.source, "10.250.0.1", false)
	}
	s.targetReady = s.waitReadyEndpoint(t, s.target)
	return s
}

// servedVMWithTarget runs a VM on the pod network with a Service, on one of two kubelet-less
// nodes, its pod a ready endpoint, and creates a migration's target pod, running but not Ready,
// on the other node, which it returns.
func servedVMWithTarget(t *testing.T, prefix string) (*servedVM, string) {
	t.Helper()
	startVMControllers(t)
	a, b := startFakeNode(t, prefix+"-a"), startFakeNode(t, prefix+"-b")
	s := &servedVM{ns: cluster.Namespace(t, prefix+"-")}
	t.Cleanup(func() { forceDeletePods(s.ns) })
	ctx := context.Background()
	vm := lostNodeVM("vm")
	vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": "vm"}
	vm.Spec.Template.Spec.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}, Ports: []v1alpha1.Port{{Name: "web", Port: 80}}}}
	vm.Spec.Template.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(s.ns).Create(ctx, vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "vm"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "vm"},
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}}}
	if _, err := cluster.Kube.CoreV1().Services(s.ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.vmi, s.source = runningVMI(t, s.ns, "vm")
	waitGate(t, s.source, corev1.ConditionTrue)
	playKubelet(t, s.source, "10.250.0.1", true)
	s.waitReadyEndpoint(t, s.source)

	targetNode := a.name
	if s.vmi.Status.NodeName == a.name {
		targetNode = b.name
	}
	target := s.source.DeepCopy()
	target.ObjectMeta = metav1.ObjectMeta{Name: s.source.Name + "-target", Namespace: s.ns, Labels: s.source.Labels, OwnerReferences: s.source.OwnerReferences}
	target.Spec.NodeName = targetNode
	target.Status = corev1.PodStatus{}
	var err error
	if s.target, err = cluster.Kube.CoreV1().Pods(s.ns).Create(ctx, target, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	playKubelet(t, s.target, "10.250.0.2", false)
	return s, targetNode
}

// moveTo plays the agents at a migration's end: the guest runs on node.
func (s *servedVM) moveTo(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(s.ns).Get(ctx, s.vmi.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		v.Status.NodeName = node
		s.vmi, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(s.ns).UpdateStatus(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitGate waits for lifeboat's controller to set pod's readiness gate to status.
func waitGate(t *testing.T, pod *corev1.Pod, status corev1.ConditionStatus) {
	t.Helper()
	kubewait.For(t, 10*time.Second, fmt.Sprintf("pod %s's readiness gate %s", pod.Name, status), func(ctx context.Context) (*corev1.Pod, error) {
		return cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	}, func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == v1alpha1.PodConditionGuestRunning {
				return c.Status == status
			}
		}
		return false
	}, func(p *corev1.Pod) string { return fmt.Sprintf("%+v", p.Status.Conditions) })
}

// playKubelet writes what a kubelet writes of pod's status: running at ip, Ready or not. The
// gate's condition, which is lifeboat's, is left as it is.
func playKubelet(t *testing.T, pod *corev1.Pod, ip string, ready bool) {
	t.Helper()
	if err := writeKubeletStatus(context.Background(), pod, ip, ready); err != nil {
		t.Fatal(err)
	}
}

func writeKubeletStatus(ctx context.Context, pod *corev1.Pod, ip string, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"phase": corev1.PodRunning, "podIP": ip, "podIPs": []corev1.PodIP{{IP: ip}},
		"conditions": []corev1.PodCondition{{Type: corev1.PodReady, Status: status}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}},
	}})
	if err != nil {
		return err
	}
	if _, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("writing pod %s's status as its kubelet: %w", pod.Name, err)
	}
	return nil
}

// slices are the namespace's EndpointSlices.
func (s *servedVM) slices(ctx context.Context) ([]discoveryv1.EndpointSlice, error) {
	l, err := cluster.Kube.DiscoveryV1().EndpointSlices(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// waitReadyEndpoint waits for a slice to list pod as a ready endpoint, and says when it saw it.
func (s *servedVM) waitReadyEndpoint(t *testing.T, pod *corev1.Pod) time.Time {
	t.Helper()
	var last []discoveryv1.EndpointSlice
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if last, err = s.slices(ctx); err != nil {
			return false, nil
		}
		for _, sl := range last {
			for _, ep := range sl.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.UID == pod.UID && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s not a ready endpoint of the Service within 30s: slices %s", pod.Name, describeSlices(last))
	}
	return time.Now()
}

// waitUnlisted waits until the source agent would no longer count the source pod as an endpoint
// a Service proxy may send to, and says when.
func (s *servedVM) waitUnlisted(t *testing.T, timeout time.Duration) time.Time {
	t.Helper()
	var last []discoveryv1.EndpointSlice
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		if last, err = s.slices(ctx); err != nil {
			return false, nil
		}
		return !agent.SourceListed(last, string(s.source.UID)), nil
	})
	if err != nil {
		t.Fatalf("the source pod %s still an endpoint a proxy may send to %s after the target was a ready one: slices %s", s.source.Name, timeout, describeSlices(last))
	}
	return time.Now()
}

func describeSlices(slices []discoveryv1.EndpointSlice) string {
	var out []string
	for _, sl := range slices {
		for _, ep := range sl.Endpoints {
			name := ""
			if ep.TargetRef != nil {
				name = ep.TargetRef.Name
			}
			c := ep.Conditions
			out = append(out, fmt.Sprintf("%s ready=%v serving=%v terminating=%v", name, deref(c.Ready), deref(c.Serving), deref(c.Terminating)))
		}
	}
	return fmt.Sprint(out)
}

func deref(b *bool) any {
	if b == nil {
		return "unset"
	}
	return *b
}
