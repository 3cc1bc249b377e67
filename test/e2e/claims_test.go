package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// createClaim makes a PersistentVolume and a claim in ns bound to it, with one access mode. The
// volume is a hostPath directory of this machine, which every emulated node sees: it stands in for
// shared storage (an NFS export, a Ceph volume) on one machine.
func createClaim(t *testing.T, ns, name string, mode corev1.PersistentVolumeAccessMode) {
	t.Helper()
	createClaimOf(t, ns, name, mode, corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: vmDir(t)}}, nil)
}

// createBlockClaim makes a Block-mode claim in ns, bound to a PersistentVolume that is a loop
// device of this machine (on a 64 MiB file starting with the test disk's label), which every
// emulated node sees: shared block storage (a SAN LUN, an RBD image) on one machine.
func createBlockClaim(t *testing.T, ns, name string, mode corev1.PersistentVolumeAccessMode) {
	t.Helper()
	backing := filepath.Join(t.TempDir(), "lun.img")
	if err := os.WriteFile(backing, []byte(images.GuestDiskLabel), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, 64<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	device := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "--detach", device).Run() })
	// A local volume must name its nodes: every node of the cluster, as shared storage would.
	anyNode := &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpExists}},
	}}}}
	createClaimOf(t, ns, name, mode, corev1.PersistentVolumeBlock, corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: device}}, anyNode)
}

// createClaimOf makes a PersistentVolume of source and a claim in ns bound to it, with one access
// mode and the volume mode.
func createClaimOf(t *testing.T, ns, name string, mode corev1.PersistentVolumeAccessMode, volumeMode corev1.PersistentVolumeMode,
	source corev1.PersistentVolumeSource, affinity *corev1.VolumeNodeAffinity) {
	t.Helper()
	ctx := context.Background()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "manual",
			VolumeMode:                    &volumeMode,
			PersistentVolumeSource:        source,
			NodeAffinity:                  affinity,
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name},
		},
	}
	if _, err := cluster.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			StorageClassName: ptr.To("manual"),
			VolumeMode:       &volumeMode,
			VolumeName:       pv.Name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}
	if _, err := cluster.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// withClaimDisk attaches the claim as the VM's disk "data".
func withClaimDisk(claim string) func(*v1alpha1.VirtualMachineInstance) {
	return func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Disks = append(v.Spec.Disks, v1alpha1.Disk{Name: "data"})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "data", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: claim}})
	}
}

// TestAVMOnASharedClaimWaitsForItThenMovesWithIt: a VMI whose claim does not exist yet stays
// Pending, without a pod, with a Warning Event naming the claim; once the claim is made (a
// ReadWriteMany one on shared storage) the VM starts, keeps its journal on the claim's disk.img,
// and a node-pressure eviction live-migrates it, the disk staying where it is: on the target the
// guest reads back every entry it wrote on the source.
func TestAVMOnASharedClaimWaitsForItThenMovesWithIt(t *testing.T) {
	const grace = 60
	setConfig(t, true)
	startController(t)
	nodes := startNodes(t, 2, func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })
	ns := testNamespace(t)
	v := createVMI(t, ns, newVMI("claimed", withClaimDisk("shared-disk"), strategy(v1alpha1.EvictionStrategyLiveMigrate),
		func(v *v1alpha1.VirtualMachineInstance) { v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace) }))

	e := waitEvent(t, ns, v.Name, "ClaimNotFound", 30*time.Second)
	if !strings.Contains(e.Message, `persistentVolumeClaim "shared-disk" does not exist in namespace `+ns) || e.Type != corev1.EventTypeWarning {
		t.Errorf("the Event %s %q does not name the missing claim", e.Type, e.Message)
	}
	if pods, err := cluster.Kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("a VMI without its claim has pods: %v, %d", err, len(pods.Items))
	}
	if got, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), v.Name, metav1.GetOptions{}); err != nil ||
		(got.Status.Phase != "" && got.Status.Phase != v1alpha1.VMIPending) {
		t.Errorf("a VMI without its claim must stay Pending: %v %s", err, describe(got))
	}

	createClaim(t, ns, "shared-disk", corev1.ReadWriteMany)
	v = waitVMI(t, ns, v.Name, bootTimeout, "Running and LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	})
	if recorded, rwx := v1alpha1.ReadWriteMany(v.Status.VolumeStatus, "data"); !recorded || !rwx {
		t.Errorf("status.volumeStatus %+v: want the claim recorded ReadWriteMany", v.Status.VolumeStatus)
	}
	source := nodeOf(t, nodes, v)
	before := waitJournal(t, source.consolePath(v), 0, bootTimeout)

	evict(t, source, v)
	moved := waitVMI(t, ns, v.Name, grace*time.Second, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	waitJournal(t, nodeOf(t, nodes, moved).consolePath(moved), before, 30*time.Second)
}

// TestAVMOnASharedBlockClaimMovesWithIt: a ReadWriteMany Block claim is the VM's disk itself (a
// device in the launcher pod, owned by its unprivileged user); the guest keeps its journal there,
// and a node-pressure eviction live-migrates it with the disk staying where it is.
func TestAVMOnASharedBlockClaimMovesWithIt(t *testing.T) {
	const grace = 60
	setConfig(t, true)
	startController(t)
	nodes := startNodes(t, 2, func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })
	ns := testNamespace(t)
	createBlockClaim(t, ns, "lun", corev1.ReadWriteMany)
	v := createVMI(t, ns, newVMI("block", withClaimDisk("lun"), strategy(v1alpha1.EvictionStrategyLiveMigrate),
		func(v *v1alpha1.VirtualMachineInstance) { v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace) }))
	v = waitVMI(t, ns, v.Name, bootTimeout, "Running and LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	})
	if !v1alpha1.BlockClaim(v.Status.VolumeStatus, "data") {
		t.Errorf("status.volumeStatus %+v: want the claim recorded as Block", v.Status.VolumeStatus)
	}
	pod := launcherPod(t, v)
	if devices := pod.Spec.Containers[0].VolumeDevices; len(devices) != 1 || devices[0].DevicePath != launcher.ClaimDevicesDir+"/data" {
		t.Errorf("the launcher's volumeDevices are %+v, want the claim at %s/data", devices, launcher.ClaimDevicesDir)
	}
	source := nodeOf(t, nodes, v)
	before := waitJournal(t, source.consolePath(v), 0, bootTimeout)
	// Printed at boot, before the journal.
	console, err := os.ReadFile(source.consolePath(v))
	if err != nil || !guest.HasLine(string(console), protocol.Disk("vda", images.GuestDiskLabel)) {
		t.Errorf("the guest does not see the block device's label (%v):\n%s", err, console)
	}

	evict(t, source, v)
	moved := waitVMI(t, ns, v.Name, grace*time.Second, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	waitJournal(t, nodeOf(t, nodes, moved).consolePath(moved), before, 30*time.Second)
}

// waitJournal waits for a journal line on vda past n in the console at path, with no error line
// before it, and returns its entry count.
func waitJournal(t *testing.T, path string, n int, timeout time.Duration) int {
	t.Helper()
	var console string
	got := 0
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		b, _ := os.ReadFile(path)
		console = string(b)
		got, _ = protocol.LastJournal(console, "vda")
		return got > n || strings.Contains(console, protocol.ErrorPrefix), nil
	})
	if err != nil || strings.Contains(console, protocol.ErrorPrefix) {
		t.Fatalf("want a journal line on vda past %d, with no error, in %s:\n%s", n, path, console)
	}
	return got
}

// TestAReadWriteOnceClaimKeepsTheVMWhereItIs: a claim only one node can mount makes the VM not
// live-migratable, with KubeVirt's reason naming the claim, so seed 000's "not migratable" rows
// apply (TestAPIEvictionFinalAnswers answers evictions of such VMs).
func TestAReadWriteOnceClaimKeepsTheVMWhereItIs(t *testing.T) {
	setConfig(t, true)
	startController(t)
	startNodes(t, 1)
	ns := testNamespace(t)
	createClaim(t, ns, "own-disk", corev1.ReadWriteOnce)
	v := createVMI(t, ns, newVMI("rwo", withClaimDisk("own-disk"), strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	v = waitVMI(t, ns, v.Name, bootTimeout, "Running with its LiveMigratable condition", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable) != nil
	})
	c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	if c.Status != metav1.ConditionFalse || c.Reason != "DisksNotLiveMigratable" || !strings.Contains(c.Message, `persistentVolumeClaim "own-disk" (volume "data") is not ReadWriteMany`) {
		t.Errorf("LiveMigratable %+v: want False, DisksNotLiveMigratable, naming the claim", c)
	}

	// A person's migration of it fails at once, with the reason, and makes no target pod.
	migrations := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	m, err := migrations.Create(context.Background(), &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "by-hand"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: v.Name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		m, err = migrations.Get(ctx, m.Name, metav1.GetOptions{})
		return err == nil && m.Status.Phase == v1alpha1.MigrationFailed, nil
	})
	if err != nil || !strings.Contains(m.Status.FailureReason, "cannot be live-migrated (DisksNotLiveMigratable)") || m.Status.TargetPod != "" {
		t.Errorf("a manual migration of it: phase %s, reason %q, target pod %q; want Failed at once, with the reason, and no target pod", m.Status.Phase, m.Status.FailureReason, m.Status.TargetPod)
	}
	if got := getVMI(t, ns, v.Name); !running(got) || got.Status.NodeName != v.Status.NodeName {
		t.Errorf("the VM must keep running where it was: %s", describe(got))
	}
}
