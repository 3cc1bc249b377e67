package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestALookAlikeLauncherMovesNothing: pods anyone may create, labelled as the launcher of
// another tenant's VM (lifeboat.dev/role=launcher, lifeboat.dev/vmi-uid=<victim>), in the
// victim's namespace and in an attacker's, newer than the real launcher, on the VM's node and on
// the node a migration takes it to, before and during that migration, get nothing of the VM:
// its directory stays linked to the pod lifeboat's controller made, no notify socket is served
// into them, the guest keeps running and moves to the recorded target pod. Each is counted
// (lifeboat_agent_launcher_impostors_total) and logged by the agent of its node. (The
// admission policy lifeboat-reserved-metadata refuses such pods where manifests/ is installed;
// this control plane has no policies, as a cluster where they were left out.)
func TestALookAlikeLauncherMovesNothing(t *testing.T) {
	// A capped bandwidth keeps the migration running while a look-alike is made on its target.
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("16Mi"))
	})
	startController(t)
	nodes := startNodes(t, 2)
	victimNS, attackerNS := testNamespace(t), testNamespace(t)
	vmi := createVMI(t, victimNS, newVMI("victim", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	vmi = waitVMI(t, victimNS, vmi.Name, bootTimeout, "phase Running with its launcher pod recorded", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.LauncherPod != nil
	})
	source := nodeOf(t, nodes, vmi)
	target := nodes[0]
	if target == source {
		target = nodes[1]
	}
	before := waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)
	waitLinked(t, source, vmi, vmi.Status.LauncherPod.UID)

	// On the VM's node: look-alikes newer than its launcher, in its namespace and another.
	onSource := []*corev1.Pod{lookAlike(t, victimNS, "lookalike-source", source, vmi), lookAlike(t, attackerNS, "lookalike-source", source, vmi)}
	waitImpostors(t, source, onSource)
	checkNothingMoved(t, source, vmi, vmi.Status.LauncherPod.UID, onSource)
	if v := getVMI(t, victimNS, vmi.Name); v.Status.EvacuationNodeName != "" || !running(v) || v.Status.NodeName != source.Name() {
		t.Errorf("look-alike pods on its node changed the victim: %s", describe(v))
	}

	// On the node the migration goes to: look-alikes made before it starts, and one made once
	// the controller has recorded the target pod (newer than the target, as an attacker racing
	// the migration would make it).
	onTarget := []*corev1.Pod{lookAlike(t, victimNS, "lookalike-target", target, vmi), lookAlike(t, attackerNS, "lookalike-target", target, vmi)}
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(victimNS).Create(context.Background(), &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "move-victim"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m := waitMigrationNamed(t, victimNS, "move-victim", "its target pod recorded", func(m *v1alpha1.VirtualMachineInstanceMigration) bool { return m.Status.TargetPodUID != "" })
	onTarget = append(onTarget, lookAlike(t, attackerNS, "lookalike-racing", target, vmi))
	moved := waitVMI(t, victimNS, vmi.Name, 2*time.Minute, "the VM on the migration's target node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	if m = waitMigrationNamed(t, victimNS, m.Name, "ended", func(m *v1alpha1.VirtualMachineInstanceMigration) bool {
		return m.Status.Phase.Terminal()
	}); m.Status.Phase != v1alpha1.MigrationSucceeded {
		t.Fatalf("migration %s: %s (%s), want Succeeded", m.Name, m.Status.Phase, m.Status.FailureReason)
	}
	if got := moved.Status.LauncherPod; got == nil || got.Name != m.Status.TargetPod || got.UID != m.Status.TargetPodUID {
		t.Errorf("the VMI records launcher pod %+v, want the migration's target %s (UID %s)", got, m.Status.TargetPod, m.Status.TargetPodUID)
	}
	waitCounterPast(t, target.consolePath(moved), before, time.Minute)
	waitImpostors(t, target, onTarget)
	checkNothingMoved(t, target, moved, m.Status.TargetPodUID, onTarget)
}

// waitMigrationNamed waits until the migration ns/name meets cond; a migration a person makes
// carries no label to find it by.
func waitMigrationNamed(t *testing.T, ns, name, what string, cond func(*v1alpha1.VirtualMachineInstanceMigration) bool) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	var m *v1alpha1.VirtualMachineInstanceMigration
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		m, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && cond(m), nil
	})
	if err != nil {
		t.Fatalf("migration %s/%s not %s within 2m: %+v", ns, name, what, m)
	}
	return m
}

// lookAlike creates, as any user allowed pods in ns could, a pod on node labelled as the
// launcher of v, with a run volume as a launcher's; it returns once the node runs it.
func lookAlike(t *testing.T, ns, name string, node *testNode, v *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIUID: string(v.UID), v1alpha1.LabelVMIName: v.Name}},
		Spec: corev1.PodSpec{
			NodeName:                     node.Name(),
			AutomountServiceAccountToken: ptr.To(false),
			Volumes:                      []corev1.Volume{{Name: launcher.RunVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: launcher.ContainerName, Image: "emulated", Command: []string{"sleep", "3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: launcher.RunVolume, MountPath: launcher.PodRunDir}}}},
		},
	}
	created, err := cluster.Kube.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("look-alike pod %s/%s not running on %s within a minute: %v", ns, name, node.Name(), err)
	}
	return created
}

// runVolume is the run volume of the pod with uid on node, seen from the host.
func runVolume(node *testNode, uid string) string {
	return filepath.Join(node.HostPath("/var/lib/kubelet/pods"), uid, "volumes/kubernetes.io~empty-dir", launcher.RunVolume)
}

// waitLinked waits until node's agent links v's directory to the run volume of the pod with podUID.
func waitLinked(t *testing.T, node *testNode, v *v1alpha1.VirtualMachineInstance, podUID types.UID) {
	t.Helper()
	link := filepath.Join(node.HostPath(launcher.DomainsDir), string(v.UID))
	var got string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got, _ = os.Readlink(link)
		return got == runVolume(node, string(podUID)), nil
	})
	if err != nil {
		t.Fatalf("%s's directory on %s links %q, want the run volume of its launcher pod %s", v.Name, node.Name(), got, podUID)
	}
}

// waitImpostors waits until node's agent has counted every pod of pods as an impostor and
// logged it.
func waitImpostors(t *testing.T, node *testNode, pods []*corev1.Pod) {
	t.Helper()
	const sample = "lifeboat_agent_launcher_impostors_total"
	var count float64
	var unlogged []string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		count = node.metric(t, sample)
		log, err := os.ReadFile(node.agent.LogPath())
		if err != nil {
			return false, err
		}
		unlogged = nil
		for _, p := range pods {
			logged := slices.ContainsFunc(strings.Split(string(log), "\n"), func(line string) bool {
				return strings.Contains(line, "refused a pod that claims to be a VM's launcher") &&
					strings.Contains(line, fmt.Sprintf(`"pod":"%s/%s","podUID":"%s"`, p.Namespace, p.Name, p.UID))
			})
			if !logged {
				unlogged = append(unlogged, p.Namespace+"/"+p.Name)
			}
		}
		return count >= float64(len(pods)) && len(unlogged) == 0, nil
	})
	if err != nil {
		t.Fatalf("the agent of %s: %s = %v, want at least %d; look-alikes not logged as refused: %v", node.Name(), sample, count, len(pods), unlogged)
	}
}

// checkNothingMoved checks that v's directory on node links the run volume of the pod with
// podUID and that the agent served no notify socket into any look-alike's run volume.
func checkNothingMoved(t *testing.T, node *testNode, v *v1alpha1.VirtualMachineInstance, podUID types.UID, lookAlikes []*corev1.Pod) {
	t.Helper()
	link := filepath.Join(node.HostPath(launcher.DomainsDir), string(v.UID))
	if got, _ := os.Readlink(link); got != runVolume(node, string(podUID)) {
		t.Errorf("%s's directory on %s links %q, want its launcher pod's run volume %q", v.Name, node.Name(), got, runVolume(node, string(podUID)))
	}
	if _, err := os.Stat(filepath.Join(link, launcher.NotifySocketName)); err != nil {
		t.Errorf("the notify socket of %s's own launcher on %s: %v", v.Name, node.Name(), err)
	}
	for _, p := range lookAlikes {
		if _, err := os.Lstat(filepath.Join(runVolume(node, string(p.UID)), launcher.NotifySocketName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("look-alike %s/%s on %s has a notify socket in its run volume (%v)", p.Namespace, p.Name, node.Name(), err)
		}
	}
}
