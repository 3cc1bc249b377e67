package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// TestAVMOfImagesMovesWithWhatItWroteToItsDisk: a VMI as a user writes it, in a cluster that
// allows no node directory: its kernel from a container image, a containerDisk and a cloud-init
// seed. The guest boots, reads its user-data and the disk image's label, and keeps a journal on the
// disk (a counter appended every second, the whole journal read back from the disk each time). The
// pod mounts nothing of the node, and the guest's writes land in the
// pod's overlay, never in the image. Then its node evicts it for memory pressure: the VM is
// live-migrated with its overlay, and on the target the guest reads back every journal entry it
// wrote on the source.
func TestAVMOfImagesMovesWithWhatItWroteToItsDisk(t *testing.T) {
	const grace = 60
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) { c.Spec.AllowedNodeDirectories = nil })
	startController(t)
	nodes := startNodes(t, 2, func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })
	ns := testNamespace(t)
	userData := "#cloud-config from the VMI"
	v := newVMI("images", withContainerDisk, strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
		v.Spec.Disks = append(v.Spec.Disks, v1alpha1.Disk{Name: "cloudinit"})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "cloudinit", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: userData + "\nhostname: images\n"}})
	})
	if paths := v1alpha1.NodePaths(v.Spec.Boot); len(paths) != 0 {
		t.Fatalf("the VMI names node paths %v", paths)
	}
	// Created directly: createVMI would allow node directories first, as a lab admin does.
	v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(context.Background(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v = waitVMI(t, ns, v.Name, bootTimeout, "phase Running and LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	})
	source := nodeOf(t, nodes, v)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	console, err := guest.WaitForConsole(ctx, source.consolePath(v), "a journal line", func(c string) bool {
		_, ok := protocol.LastJournal(c, "vda")
		return ok
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{protocol.UserData(userData), protocol.Disk("vda", images.GuestDiskLabel)} {
		if !guest.HasLine(console, want) {
			t.Errorf("the guest's console lacks the line %q:\n%s", want, console)
		}
	}

	root := source.ImageRoot(images.GuestDiskImage)
	if root == "" {
		t.Fatalf("node %s never pulled %s", source.Name(), images.GuestDiskImage)
	}
	disk, err := os.ReadFile(filepath.Join(root, images.GuestDiskPath))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(disk), images.GuestDiskLabel) || strings.Contains(string(disk), protocol.DiskWritten) {
		t.Errorf("the containerDisk image on the node changed: the guest's writes must land in its overlay")
	}
	pod := launcherPod(t, v)
	imageVolumes := map[string]bool{}
	for _, vol := range pod.Spec.Volumes {
		if vol.HostPath != nil {
			t.Errorf("the launcher pod mounts node path %s (volume %s)", vol.HostPath.Path, vol.Name)
		}
		if vol.Image != nil {
			imageVolumes[vol.Image.Reference] = true
		}
	}
	if !imageVolumes[images.GuestKernelImage] || !imageVolumes[images.GuestDiskImage] {
		t.Errorf("the launcher pod's image volumes are %v, want the kernel's and the containerDisk's", imageVolumes)
	}

	before := waitCounterPast(t, source.consolePath(v), 0, bootTimeout)
	evict(t, source, v)
	moved := waitVMI(t, ns, v.Name, grace*time.Second, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	target := nodeOf(t, nodes, moved)
	// On the target, the journal read back from the disk holds what was written on the source.
	waitJournal(t, target.consolePath(moved), before, 30*time.Second)
}

// TestCloudInitUserDataFromASecret: user data that holds secrets comes from a Secret, which the
// node mounts into the VM's pod; lifeboat's controller never reads it. While the Secret is missing
// the pod waits with the node's FailedMount Event naming it; once it exists the guest reads the
// Secret's user data.
func TestCloudInitUserDataFromASecret(t *testing.T) {
	startController(t)
	n := startNodes(t, 1)[0]
	ns := testNamespace(t)
	v := createVMI(t, ns, newVMI("secret-seed", func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Disks = append(v.Spec.Disks, v1alpha1.Disk{Name: "cloudinit"})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "cloudinit", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{
			UserDataSecretRef: &corev1.LocalObjectReference{Name: "seed"},
		}})
	}))
	waitEvent(t, ns, v.Name, "SuccessfulCreate", 30*time.Second)
	pod := launcherPod(t, v)
	e := waitEvent(t, ns, pod.Name, "FailedMount", 30*time.Second)
	if !strings.Contains(e.Message, `secret "seed"`) {
		t.Errorf("FailedMount %q does not name the missing Secret", e.Message)
	}
	// A user looks at the VMI, not its pod: the controller relays the kubelet's word to it.
	e = kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.kind": "VirtualMachineInstance", "involvedObject.name": v.Name, "reason": vmi.ReasonFailedMount}, 30*time.Second)
	if !strings.Contains(e.Message, `secret "seed"`) || !strings.Contains(e.Message, pod.Name) || e.Type != corev1.EventTypeWarning {
		t.Errorf("the VMI's %s Event %q (%s) does not name the missing Secret and the pod", e.Reason, e.Message, e.Type)
	}
	if got := getVMI(t, ns, v.Name).Status.Phase; got == v1alpha1.VMIRunning {
		t.Errorf("VMI phase %s while its Secret is missing, want it waiting", got)
	}

	const first = "#cloud-config with a password"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "seed"}, Data: map[string][]byte{"userdata": []byte(first + "\npassword: hunter2\n")}}
	if _, err := cluster.Kube.CoreV1().Secrets(ns).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v = waitVMI(t, ns, v.Name, bootTimeout, "phase Running", running)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, n.consolePath(v), protocol.UserData(first)); err != nil {
		t.Fatal(err)
	}
}
