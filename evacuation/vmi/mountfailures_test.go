package vmi

import (
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestOnlyAPendingLauncherPodsMountFailureReachesItsVMI: the kubelet's FailedMount Event of a
// launcher pod still waiting for its volumes is told on the VMI; nothing else is.
func TestOnlyAPendingLauncherPodsMountFailureReachesItsVMI(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vmi-uid"}}
	launcher := func(name string, uid types.UID, phase corev1.PodPhase, owner *v1alpha1.VirtualMachineInstance) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid}, Status: corev1.PodStatus{Phase: phase}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
		}
		return p
	}
	other := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "an-earlier-vmi"}}
	pods := []*corev1.Pod{
		launcher("pending", "p1", corev1.PodPending, vmi),
		launcher("running", "p2", corev1.PodRunning, vmi),
		launcher("orphan", "p3", corev1.PodPending, nil),
		launcher("stale-owner", "p4", corev1.PodPending, other),
	}
	podIndex := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, p := range pods {
		_ = podIndex.Add(p)
	}
	vmiIndex := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	_ = vmiIndex.Add(vmi)

	tests := []struct {
		name    string
		pod     string
		uid     types.UID
		relayed bool
	}{
		{name: "a pending launcher pod", pod: "pending", uid: "p1", relayed: true},
		{name: "a pod that has started since", pod: "running", uid: "p2"},
		{name: "an earlier pod of the same name", pod: "pending", uid: "p0"},
		{name: "a pod no VMI controls", pod: "orphan", uid: "p3"},
		{name: "a pod of an earlier VMI of the same name", pod: "stale-owner", uid: "p4"},
		{name: "a pod not in the cache", pod: "gone", uid: "p5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recorder := record.NewFakeRecorder(1)
			c := &Controller{pods: corelisters.NewPodLister(podIndex), vmis: lifeboatlisters.NewVirtualMachineInstanceLister(vmiIndex),
				recorder: recorder, log: slog.New(slog.DiscardHandler)}
			c.relayMountFailure(&corev1.Event{
				Reason:         ReasonFailedMount,
				Message:        `MountVolume.SetUp failed for volume "vol-cloudinit" : secret "seed" not found`,
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: tt.pod, UID: tt.uid},
			})
			var got string
			select {
			case got = <-recorder.Events:
			default:
			}
			want := ""
			if tt.relayed {
				want = `Warning FailedMount launcher pod pending: MountVolume.SetUp failed for volume "vol-cloudinit" : secret "seed" not found`
			}
			if got != want {
				t.Errorf("the VMI's Event is %q, want %q", got, want)
			}
		})
	}
}
