package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/images"
)

// TestAVMMadeOfImagesAndCloudInitNamesNoNodePath: a VMI as a user writes it, with no
// LifeboatConfig at all (so no node directory is allowed): its kernel from a container image, a
// containerDisk and a cloud-init seed. The guest boots, reads its user-data, reads the disk image's
// label and writes to the disk; the write lands in the pod's overlay, never in the image; the pod
// mounts nothing of the node but lifeboat's run directory; and the containerDisk keeps it from
// being live-migrated, with KubeVirt's reason naming the volume.
func TestAVMMadeOfImagesAndCloudInitNamesNoNodePath(t *testing.T) {
	startController(t)
	n := startNodes(t, 1)[0]
	ns := testNamespace(t)
	userData := "#cloud-config from the VMI"
	v := newVMI("images", withContainerDisk, func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Disks = append(v.Spec.Disks, v1alpha1.Disk{Name: "cloudinit"})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "cloudinit", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: userData + "\nhostname: images\n"}})
	})
	if paths := v1alpha1.NodePaths(v.Spec.Boot); len(paths) != 0 {
		t.Fatalf("the VMI names node paths %v", paths)
	}
	// Created directly: createVMI would first allow node directories as a lab admin does.
	v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(context.Background(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v = waitVMI(t, ns, v.Name, bootTimeout, "phase Running", running)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	console, err := guest.WaitForLine(ctx, n.consolePath(v), protocol.Ready)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{protocol.UserData(userData), protocol.Disk("vda", images.GuestDiskLabel)} {
		if !guest.HasLine(console, want) {
			t.Errorf("the guest's console lacks the line %q:\n%s", want, console)
		}
	}
	if strings.Contains(console, protocol.ErrorPrefix) {
		t.Errorf("the guest reported errors:\n%s", console)
	}

	root := n.ImageRoot(images.GuestDiskImage)
	if root == "" {
		t.Fatalf("node %s never pulled %s", n.Name(), images.GuestDiskImage)
	}
	disk, err := os.ReadFile(filepath.Join(root, images.GuestDiskPath))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(disk), images.GuestDiskLabel) || strings.Contains(string(disk), protocol.DiskWritten) {
		t.Errorf("the containerDisk image on the node changed: the guest's write must land in its overlay")
	}

	pod := launcherPod(t, v)
	for _, vol := range pod.Spec.Volumes {
		if vol.HostPath != nil && vol.HostPath.Path != "/var/run/lifeboat" {
			t.Errorf("the launcher pod mounts node path %s (volume %s)", vol.HostPath.Path, vol.Name)
		}
	}
	wantImages := map[string]bool{images.GuestKernelImage: false, images.GuestDiskImage: false}
	for _, vol := range pod.Spec.Volumes {
		if vol.Image != nil {
			wantImages[vol.Image.Reference] = true
		}
	}
	for ref, found := range wantImages {
		if !found {
			t.Errorf("the launcher pod has no image volume of %s: %+v", ref, pod.Spec.Volumes)
		}
	}
	c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "DisksNotLiveMigratable" || !strings.Contains(c.Message, `containerDisk volume "data"`) {
		t.Errorf("LiveMigratable: %+v; want False, reason DisksNotLiveMigratable, naming the volume", c)
	}
}
