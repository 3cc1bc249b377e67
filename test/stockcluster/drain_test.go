package stockcluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// bootTimeout: a TCG guest's boot on this loaded 2-core machine, with its images pulled first.
const bootTimeout = 4 * time.Minute

// vm starts a VMI of the test guest, booted from the registry's images.
func (s *stock) vm(t testing.TB, ns, name string, strategy v1alpha1.EvictionStrategy) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: s.vmiSpec(strategy)}
	created, err := s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(t.Context(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// virtualMachine starts a VirtualMachine whose instance is vmiSpec's, run strategy Always.
func (s *stock) virtualMachine(t testing.TB, ns, name string, strategy v1alpha1.EvictionStrategy) {
	t.Helper()
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: v1alpha1.RunStrategyAlways,
			Template: v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: s.vmiSpec(strategy)}},
	}
	if _, err := s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(t.Context(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// vmiSpec is the test guest booted from the registry's images, with a containerDisk.
func (s *stock) vmiSpec(strategy v1alpha1.EvictionStrategy) v1alpha1.VirtualMachineInstanceSpec {
	return v1alpha1.VirtualMachineInstanceSpec{
		CPUs: 1, Memory: resource.MustParse("128Mi"),
		Boot: v1alpha1.BootSource{
			Container: &v1alpha1.KernelBootContainer{Image: s.guestKernel, KernelPath: images.GuestKernelPath, InitrdPath: images.GuestInitrdPath},
			Cmdline:   guest.Cmdline,
		},
		TerminationGracePeriodSeconds: ptr.To[int64](20),
		EvictionStrategy:              ptr.To(strategy),
		Disks:                         []v1alpha1.Disk{{Name: "data"}},
		Volumes:                       []v1alpha1.Volume{{Name: "data", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: s.guestDisk}}},
	}
}

// waitVMI waits until the VMI satisfies ok.
func (s *stock) waitVMI(t testing.TB, ns, name string, timeout time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	return kubewait.For(t, timeout, fmt.Sprintf("VMI %s/%s %s", ns, name, what), func(ctx context.Context) (*v1alpha1.VirtualMachineInstance, error) {
		return s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
	}, ok, func(v *v1alpha1.VirtualMachineInstance) string {
		return fmt.Sprintf("phase %s on %q, migration %+v, conditions %+v", v.Status.Phase, v.Status.NodeName, v.Status.MigrationState, v.Status.Conditions)
	})
}

// namespace makes a namespace for one test.
func (s *stock) namespace(t testing.TB, name string) string {
	t.Helper()
	s.shell(t, t.TempDir(), "kubectl create namespace "+name, time.Minute)
	t.Cleanup(func() {
		_ = s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(name).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return name
}

// testDrain drains a node of two LiveMigrate VMs and a VM whose instances are not migrated; it
// returns how long kubectl drain took.
func (s *stock) testDrain(t testing.TB) time.Duration {
	ns := s.namespace(t, "drain")
	from, to := s.nodes[0].Name(), s.nodes[1].Name()
	dir := t.TempDir()
	// The VMs start on the node to drain: the other is cordoned meanwhile.
	s.shell(t, dir, "kubectl cordon "+to, time.Minute)
	names := []string{"vm-a", "vm-b"}
	for _, name := range names {
		s.vm(t, ns, name, v1alpha1.EvictionStrategyLiveMigrate)
	}
	// A VM whose instances are not migrated (eviction strategy None), run strategy Always: the
	// drain evicts its instance, and its VM makes another, which can run only on the other node.
	s.virtualMachine(t, ns, "vm-none", v1alpha1.EvictionStrategyNone)
	for _, name := range append(names, "vm-none") {
		v := s.waitVMI(t, ns, name, bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.VMIRunning })
		if v.Status.NodeName != from {
			t.Fatalf("VMI %s runs on %s, want %s", name, v.Status.NodeName, from)
		}
	}
	s.shell(t, dir, "kubectl uncordon "+to, time.Minute)
	start := time.Now()
	s.shell(t, dir, "kubectl drain "+from+" --ignore-daemonsets --delete-emptydir-data --timeout=5m", 6*time.Minute)
	took := time.Since(start)
	t.Logf("kubectl drain %s completed in %s", from, took.Round(time.Second))
	for _, name := range names {
		v := s.waitVMI(t, ns, name, time.Minute, "Running on "+to+" after a completed migration", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.VMIRunning && v.Status.NodeName == to && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
		})
		if v.Status.MigrationState.SourceNode != from {
			t.Errorf("VMI %s migrated from %s, want %s", name, v.Status.MigrationState.SourceNode, from)
		}
	}
	s.waitVMI(t, ns, "vm-none", bootTimeout, "a new instance Running on "+to+", as its run strategy Always says", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMIRunning && v.Status.NodeName == to && v.Status.MigrationState == nil
	})
	s.shell(t, dir, "kubectl uncordon "+from, time.Minute)
	return took
}
