package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/images"
)

// cloudInitLine is what the cloud image's user data has the guest print on its serial console,
// once cloud-init has run its last stage: the host name cloud-init set from the seed's meta-data.
const cloudInitLine = "lifeboat cloud-init ran on cloudy"

// TestACloudImageBootsThroughItsFirmwareAndConfiguresItself: a Debian cloud image in a
// containerDisk, as a user brings one: no kernel of lifeboat's, the firmware boots GRUB from the
// disk, and the image's own cloud-init (22.4) reads lifeboat's NoCloud seed: the host name from
// the meta-data (the VMI's name), and the user data's runcmd, which prints on the serial console.
func TestACloudImageBootsThroughItsFirmwareAndConfiguresItself(t *testing.T) {
	imgs, err := images.CloudImages(t.Context(), os.Stderr)
	if err != nil {
		t.Fatalf("the Debian cloud image: %v", err)
	}
	if err := images.WriteStore(imageStore, imgs); err != nil {
		t.Fatal(err)
	}
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) { c.Spec.AllowedNodeDirectories = nil })
	startController(t)
	n := startNodes(t, 1)[0]
	ns := testNamespace(t)
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "cloudy"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 1, Memory: resource.MustParse("1Gi"),
			TerminationGracePeriodSeconds: ptr.To[int64](20),
			EvictionStrategy:              ptr.To(v1alpha1.EvictionStrategyNone),
			Disks:                         []v1alpha1.Disk{{Name: "root"}, {Name: "cloudinit"}},
			Volumes: []v1alpha1.Volume{
				{Name: "root", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: images.CloudImage}},
				{Name: "cloudinit", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{
					UserData: "#cloud-config\nruncmd:\n  - echo \"lifeboat cloud-init ran on $(hostname)\" > /dev/ttyS0\n",
				}},
			},
		},
	}
	v, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(context.Background(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v = waitVMI(t, ns, v.Name, bootTimeout, "phase Running", running)
	// Under TCG: the firmware, GRUB, the kernel, systemd and cloud-init's four stages in Python.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := guest.WaitForLine(ctx, n.consolePath(v), cloudInitLine); err != nil {
		t.Fatal(err)
	}
	t.Logf("cloud-init ran %s after the guest started", time.Since(start).Round(time.Second))
}
