package vm

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubeinformers "k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A restart is counted even when the first status write finds the controller's cache behind the
// API server: the ended instance is deleted by then, so a retried sync would not count it.
func TestARestartIsCountedDespiteAConflict(t *testing.T) {
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "vm-uid", Finalizers: []string{FinalizerInstance}},
		Spec:       v1alpha1.VirtualMachineSpec{RunStrategy: v1alpha1.RunStrategyAlways},
	}
	ended := NewInstance(vm)
	ended.UID = "ended"
	ended.Status.Phase = v1alpha1.VMISucceeded
	lb := lifeboatfake.NewSimpleClientset(vm, ended)
	conflicts := 0
	lb.PrependReactor("update", "virtualmachines", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && conflicts == 0 {
			conflicts++
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupName, Resource: "virtualmachines"}, vm.Name, nil)
		}
		return false, nil, nil
	})
	factory := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	pods := kubeinformers.NewSharedInformerFactory(kubefake.NewSimpleClientset(), 0).Core().V1().Pods()
	vms, vmis := factory.Lifeboat().V1alpha1().VirtualMachines(), factory.Lifeboat().V1alpha1().VirtualMachineInstances()
	c := New(lb, vms, vmis, pods, record.NewFakeRecorder(10), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err := vms.Informer().GetIndexer().Add(vm); err != nil {
		t.Fatal(err)
	}
	if err := vmis.Informer().GetIndexer().Add(ended); err != nil {
		t.Fatal(err)
	}

	if err := c.sync(context.Background(), "ns/vm"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	got, err := lb.LifeboatV1alpha1().VirtualMachines("ns").Get(context.Background(), "vm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if conflicts != 1 || got.Status.Restarts != 1 {
		t.Errorf("after a status write that conflicted once (%d conflicts): restarts %d, want 1", conflicts, got.Status.Restarts)
	}
	if _, err := lb.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(context.Background(), "vm", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ended instance must be deleted: %v", err)
	}
}
