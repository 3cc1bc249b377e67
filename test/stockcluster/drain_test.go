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

// TestOnAStockCluster installs lifeboat as the README says on a cluster with upstream defaults
// (package doc) and drains a node of LiveMigrate VMs there.
func TestOnAStockCluster(t *testing.T) {
	s := startStock(t)
	s.shell(t, t.TempDir(), "kubectl lifeboat check || true", time.Minute)
	t.Run("a drain moves every LiveMigrate VM to the other node and completes", func(t *testing.T) { s.testDrain(t) })
}

// vm starts a VMI of the test guest, booted from the registry's images.
func (s *stock) vm(t *testing.T, ns, name string, strategy v1alpha1.EvictionStrategy) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 1, Memory: resource.MustParse("128Mi"),
			Boot: v1alpha1.BootSource{
				Container: &v1alpha1.KernelBootContainer{Image: s.guestKernel, KernelPath: images.GuestKernelPath, InitrdPath: images.GuestInitrdPath},
				Cmdline:   guest.Cmdline,
			},
			TerminationGracePeriodSeconds: ptr.To[int64](20),
			EvictionStrategy:              ptr.To(strategy),
			Disks:                         []v1alpha1.Disk{{Name: "data"}},
			Volumes:                       []v1alpha1.Volume{{Name: "data", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: s.guestDisk}}},
		},
	}
	created, err := s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(t.Context(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// waitVMI waits until the VMI satisfies ok.
func (s *stock) waitVMI(t *testing.T, ns, name string, timeout time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	return kubewait.For(t, timeout, fmt.Sprintf("VMI %s/%s %s", ns, name, what), func(ctx context.Context) (*v1alpha1.VirtualMachineInstance, error) {
		return s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
	}, ok, func(v *v1alpha1.VirtualMachineInstance) string {
		return fmt.Sprintf("phase %s on %q, migration %+v, conditions %+v", v.Status.Phase, v.Status.NodeName, v.Status.MigrationState, v.Status.Conditions)
	})
}

// namespace makes a namespace for one test.
func (s *stock) namespace(t *testing.T, name string) string {
	t.Helper()
	s.shell(t, t.TempDir(), "kubectl create namespace "+name, time.Minute)
	t.Cleanup(func() {
		_ = s.cp.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(name).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return name
}

func (s *stock) testDrain(t *testing.T) {
	ns := s.namespace(t, "drain")
	from, to := s.nodes[0].Name(), s.nodes[1].Name()
	dir := t.TempDir()
	// The VMs start on the node to drain: the other is cordoned meanwhile.
	s.shell(t, dir, "kubectl cordon "+to, time.Minute)
	names := []string{"vm-a", "vm-b"}
	for _, name := range names {
		s.vm(t, ns, name, v1alpha1.EvictionStrategyLiveMigrate)
	}
	for _, name := range names {
		v := s.waitVMI(t, ns, name, bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.VMIRunning })
		if v.Status.NodeName != from {
			t.Fatalf("VMI %s runs on %s, want %s", name, v.Status.NodeName, from)
		}
	}
	s.shell(t, dir, "kubectl uncordon "+to, time.Minute)
	start := time.Now()
	s.shell(t, dir, "kubectl drain "+from+" --ignore-daemonsets --delete-emptydir-data --timeout=5m", 6*time.Minute)
	t.Logf("kubectl drain %s completed in %s", from, time.Since(start).Round(time.Second))
	for _, name := range names {
		v := s.waitVMI(t, ns, name, time.Minute, "Running on "+to+" after a completed migration", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.VMIRunning && v.Status.NodeName == to && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
		})
		if v.Status.MigrationState.SourceNode != from {
			t.Errorf("VMI %s migrated from %s, want %s", name, v.Status.MigrationState.SourceNode, from)
		}
	}
	s.shell(t, dir, "kubectl uncordon "+from, time.Minute)
}
