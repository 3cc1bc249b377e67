package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// A launcher's libvirtd is a helper its guest does not need to run: killed, it is restarted by
// its launcher and takes the running QEMU back. The guest neither stops nor reboots, its pod and
// VMI stay as they were, the agent says what happened and manages the VM again (it migrates).
// Killed in the middle of a migration, on the source or on the target, it fails that migration,
// and the VM runs on where it was until the retry moves it.
func TestKillingALaunchersLibvirtd(t *testing.T) {
	setConfig(t, false)
	startController(t)
	nodes := startNodes(t, 2)
	vmi, source, before := liveMigrateVM(t, nodes, "libvirtd-killed")
	pod := launcherPod(t, vmi)
	watch := watchGuest(t, nodes, vmi)

	killed := killLibvirtd(t, pod)
	waitEvent(t, vmi.Namespace, vmi.Name, "LibvirtdRestarted", time.Minute)
	restarted := waitNewLibvirtd(t, pod, killed)
	t.Logf("libvirtd %d of pod %s killed; its launcher started libvirtd %d", killed, pod.Name, restarted)
	waitCounterPast(t, source.consolePath(vmi), before+3, 30*time.Second)
	checkNoReboot(t, source.consolePath(vmi), 1)
	now, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != pod.UID || now.Status.Phase != corev1.PodRunning || now.DeletionTimestamp != nil {
		t.Errorf("after the restart of its libvirtd the launcher pod is %s (uid %s, deleted %v), want the same pod %s Running", now.Status.Phase, now.UID, now.DeletionTimestamp, pod.UID)
	}
	if v := waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running", running); v.Status.NodeName != source.Name() {
		t.Errorf("after the restart of its libvirtd the VM runs on %s: %s", source.Name(), describe(v))
	}

	// Mid-migration: the migration fails, and the VM runs on the source.
	setConfig(t, false, slowMigrations)
	setMark(t, vmi, true)
	m := waitMigrationOf(t, vmi, "Running", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase == v1alpha1.MigrationRunning
	})
	waitTransferring(t, source, vmi)
	before = lastCounterOn(t, source.consolePath(vmi))
	killed = killLibvirtd(t, pod)
	t.Logf("killed libvirtd %d of the source pod while %s ran", killed, m.Name)
	failed := waitMigrationOf(t, vmi, "Failed with a reason", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Name == m.Name && x.Status.Phase == v1alpha1.MigrationFailed && x.Status.FailureReason != ""
	})
	t.Logf("migration %s failed: %s", failed.Name, failed.Status.FailureReason)
	waitNewLibvirtd(t, pod, killed)
	waitCounterPast(t, source.consolePath(vmi), before+3, 30*time.Second)
	checkNoReboot(t, source.consolePath(vmi), 1)
	if v := waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running", running); v.Status.NodeName != source.Name() {
		t.Errorf("after the failed migration the VM runs on %s: %s", source.Name(), describe(v))
	}
	// The retry moves it: the agent manages the guest through the restarted daemon.
	finishEvacuation(t, nodes, vmi, source, m)

	// Mid-migration on the target: the migration fails, the target pod goes, and the VM runs on
	// where it was.
	here := nodeOf(t, nodes, waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running", running))
	setConfig(t, false, slowMigrations)
	setMark(t, vmi, true)
	m = waitMigrationOf(t, vmi, "Running from "+here.Name(), func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Status.Phase == v1alpha1.MigrationRunning && x.Status.SourceNode == here.Name()
	})
	target, err := cluster.Kube.CoreV1().Pods(vmi.Namespace).Get(context.Background(), m.Status.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitTransferring(t, here, vmi)
	before = lastCounterOn(t, here.consolePath(vmi))
	killed = killLibvirtd(t, target)
	t.Logf("killed libvirtd %d of the target pod %s while %s ran", killed, target.Name, m.Name)
	failed = waitMigrationOf(t, vmi, "Failed with a reason", func(x *v1alpha1.VirtualMachineInstanceMigration) bool {
		return x.Name == m.Name && x.Status.Phase == v1alpha1.MigrationFailed && x.Status.FailureReason != ""
	})
	t.Logf("migration %s failed: %s", failed.Name, failed.Status.FailureReason)
	waitCounterPast(t, here.consolePath(vmi), before+3, 30*time.Second)
	// The guest arrived here by migration: its boot is on the other node's console.
	checkNoReboot(t, here.consolePath(vmi), 0)
	if v := waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running", running); v.Status.NodeName != here.Name() {
		t.Errorf("after the failed migration the VM runs on %s: %s", here.Name(), describe(v))
	}
	waitGone(t, target)
	finishEvacuation(t, nodes, vmi, here, m)
	watch.check(t)
}

// waitTransferring waits until the VMI's migration from node sends the guest's memory: a
// migration's phase is Running from before libvirt begins it, and a kill before then only
// delays it.
func waitTransferring(t *testing.T, node *testNode, vmi *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	c, err := domain.Connect(filepath.Join(node.HostPath("/var/run/lifeboat"), "domains", string(vmi.UID), "libvirt-sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var last domain.JobStats
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last, _ = c.JobStats(domain.DomainName(vmi.Namespace, vmi.Name))
		return last.Type == domain.JobUnbounded && last.DataProcessed > 0, nil
	})
	if err != nil {
		t.Fatalf("the migration of %s from %s sent no memory within a minute; last job statistics %+v", vmi.Name, node.Name(), last)
	}
}

// killLibvirtd SIGKILLs the pod's libvirtd and returns its pid.
func killLibvirtd(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	pid := podProcess(pod, "libvirtd")
	if pid == 0 {
		t.Fatalf("no libvirtd process for pod %s", pod.Name)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitNewLibvirtd waits until the pod has a libvirtd other than the killed one, and returns its pid.
func waitNewLibvirtd(t *testing.T, pod *corev1.Pod, killed int) int {
	t.Helper()
	var pid int
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		pid = podProcess(pod, "libvirtd")
		return pid != 0 && pid != killed, nil
	})
	if err != nil {
		t.Fatalf("pod %s has no new libvirtd a minute after libvirtd %d was killed (last seen %d)", pod.Name, killed, pid)
	}
	return pid
}

// checkNoReboot fails the test if the console shows the guest booting more often than boots.
func checkNoReboot(t *testing.T, console string, boots int) {
	t.Helper()
	b, err := os.ReadFile(console)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), protocol.Ready); n != boots {
		t.Errorf("the console %s shows %q %d times, want %d: the guest rebooted", console, protocol.Ready, n, boots)
	}
}
