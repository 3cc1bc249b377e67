package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// probeEnv makes the e2e binary a socket probe (see maybeRunProbe): it holds the paths to dial.
const probeEnv = "LIFEBOAT_E2E_PROBE"

// maybeRunProbe dials each unix socket named in $LIFEBOAT_E2E_PROBE and prints, as JSON, the
// error of each ("" for a connection), then exits. The test runs it inside a launcher's mount
// namespace, as the launcher's user: what it reaches, a launcher reaches.
func maybeRunProbe() {
	raw, ok := os.LookupEnv(probeEnv)
	if !ok {
		return
	}
	var paths []string
	if err := json.Unmarshal([]byte(raw), &paths); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	results := map[string]string{}
	for _, p := range paths {
		c, err := net.DialTimeout("unix", p, 5*time.Second)
		if err != nil {
			results[p] = err.Error()
			continue
		}
		c.Close()
		results[p] = ""
	}
	_ = json.NewEncoder(os.Stdout).Encode(results)
	os.Exit(0)
}

// forgeEnv makes the e2e binary a forger (see maybeForge): it holds a forgery.
const forgeEnv = "LIFEBOAT_E2E_FORGE"

// forgery is what a compromised launcher sends on its own notify socket: a hello naming
// Hello, then a GracefulShutdown report for Report.
type forgery struct {
	Socket        string
	Hello, Report notify.VMIRef
}

// maybeForge sends the forgery in $LIFEBOAT_E2E_FORGE and prints "closed" if the agent closed
// the connection within 5 s, "open" otherwise, then exits.
func maybeForge() {
	raw, ok := os.LookupEnv(forgeEnv)
	if !ok {
		return
	}
	var f forgery
	if err := json.Unmarshal([]byte(raw), &f); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c, err := net.DialTimeout("unix", f.Socket, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	now := time.Now()
	_ = notify.Write(c, &notify.Message{Kind: notify.KindHello, VMI: f.Hello, Time: now})
	_ = notify.Write(c, &notify.Message{Kind: notify.KindGracefulShutdown, VMI: f.Report, Time: now, PodGracePeriodSeconds: 30})
	_ = c.SetReadDeadline(now.Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
		fmt.Print("closed")
	} else {
		fmt.Print("open")
	}
	os.Exit(0)
}

// forgeFrom sends f from inside the launcher of pod, as probeFrom runs its probe; it reports
// whether the agent closed the connection.
func forgeFrom(t *testing.T, pod *corev1.Pod, f forgery) bool {
	t.Helper()
	arg, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := strconv.Itoa(launcher.UID), strconv.Itoa(launcher.GID)
	cmd := exec.Command("nsenter", "--target", strconv.Itoa(launcherPID(t, pod)), "--mount", "--setuid", uid, "--setgid", gid, "--", probe)
	cmd.Env = []string{forgeEnv + "=" + string(arg)}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("forging from inside launcher %s: %v\n%s", pod.Name, err, out)
	}
	return string(out) == "closed"
}

// probeFrom dials paths from inside the launcher of pod: its mount namespace (nsenter), its
// user and group, no capability.
func probeFrom(t *testing.T, pod *corev1.Pod, paths []string) map[string]string {
	t.Helper()
	pid := launcherPID(t, pod)
	arg, err := json.Marshal(paths)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid := strconv.Itoa(launcher.UID), strconv.Itoa(launcher.GID)
	cmd := exec.Command("nsenter", "--target", strconv.Itoa(pid), "--mount", "--setuid", uid, "--setgid", gid, "--", probe)
	cmd.Env = []string{probeEnv + "=" + string(arg)}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("probing from inside launcher %s: %v\n%s", pod.Name, err, out)
	}
	results := map[string]string{}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("the probe's output %q: %v", out, err)
	}
	return results
}

// TestRestrictedLaunchersRunMoveAndReachOnlyTheirOwnSockets: in a namespace that enforces Pod
// Security "restricted", two VMs start on one node; from inside one launcher, as its user, its own
// libvirt socket answers and no socket of the other VM (libvirt or notify, by any path on the
// node) can be opened. Then one VM live-migrates to a second node: its target pod was admitted
// under "restricted" too.
func TestRestrictedLaunchersRunMoveAndReachOnlyTheirOwnSockets(t *testing.T) {
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) { c.Spec.AllowedNodeDirectories = nil })
	startController(t)
	source := startNodes(t, 1)[0]
	ns := restrictedNamespace(t)
	var vmis []*v1alpha1.VirtualMachineInstance
	for _, name := range []string{"one", "other"} {
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(context.Background(),
			newVMI(name, strategy(v1alpha1.EvictionStrategyLiveMigrate)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		vmis = append(vmis, waitVMI(t, ns, name, bootTimeout, "phase Running", running))
	}
	one, other := vmis[0], vmis[1]
	onePod, otherPod := launcherPod(t, one), launcherPod(t, other)
	checkUnprivileged(t, onePod, false)
	otherDir := filepath.Join(source.HostPath("/var/lib/kubelet/pods"), string(otherPod.UID), "volumes/kubernetes.io~empty-dir", launcher.RunVolume)
	otherLink := filepath.Join(source.HostPath(launcher.DomainsDir), string(other.UID))
	own := filepath.Join(launcher.PodRunDir, launcher.LibvirtSocket)
	results := probeFrom(t, onePod, []string{
		own,
		filepath.Join(otherLink, launcher.LibvirtSocket), filepath.Join(otherLink, launcher.NotifySocketName),
		filepath.Join(otherDir, launcher.LibvirtSocket), filepath.Join(otherDir, launcher.NotifySocketName),
	})
	for path, err := range results {
		switch {
		case path == own && err != "":
			t.Errorf("the launcher cannot reach its own libvirt socket %s: %s", path, err)
		case path != own && err == "":
			t.Errorf("the launcher of %s connected to %s, a socket of %s", one.Name, path, other.Name)
		}
	}

	// A launcher speaks only for its own VM: one's launcher, on its own notify socket, says it
	// is other's, or reports other's graceful shutdown; the agent closes the connection, counts
	// it, and other is not marked.
	ref := func(v *v1alpha1.VirtualMachineInstance) notify.VMIRef {
		return notify.VMIRef{Namespace: v.Namespace, Name: v.Name, UID: string(v.UID)}
	}
	ownNotify := filepath.Join(launcher.PodRunDir, launcher.NotifySocketName)
	for _, f := range []struct {
		name, reason string
		forgery      forgery
	}{
		{"a hello as the other VM", "wrong-vmi", forgery{Socket: ownNotify, Hello: ref(other), Report: ref(other)}},
		{"the other VM's graceful shutdown", "vmi-mismatch", forgery{Socket: ownNotify, Hello: ref(one), Report: ref(other)}},
		{"a hello with its own UID and the other VM's name", "wrong-vmi", forgery{Socket: ownNotify,
			Hello:  notify.VMIRef{Namespace: ns, Name: other.Name, UID: string(one.UID)},
			Report: notify.VMIRef{Namespace: ns, Name: other.Name, UID: string(one.UID)}}},
	} {
		rejected := fmt.Sprintf(`lifeboat_agent_notify_rejected_total{reason=%q}`, f.reason)
		before := source.metric(t, rejected)
		if !forgeFrom(t, onePod, f.forgery) {
			t.Errorf("%s from %s's launcher: the agent kept the connection open", f.name, one.Name)
		}
		if got := source.metric(t, rejected); got < before+1 {
			t.Errorf("%s: %s = %v, want it counted (it was %v before)", f.name, rejected, got, before)
		}
	}
	if v := getVMI(t, ns, other.Name); v.Status.EvacuationNodeName != "" || v.Status.Phase != v1alpha1.VMIRunning {
		t.Errorf("a forged report from another launcher changed %s: %s", other.Name, describe(v))
	}

	target := startNodes(t, 1)[0]
	before := waitCounterPast(t, source.consolePath(one), 0, bootTimeout)
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Create(context.Background(), &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "move-one"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: one.Name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	moved := waitVMI(t, ns, one.Name, 2*time.Minute, "the VM on the second node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	waitCounterPast(t, target.consolePath(moved), before, time.Minute)
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(one.UID) + "," + launcher.LabelMigrationUID})
		return err == nil && len(p.Items) == 1 && p.Items[0].Spec.NodeName == target.Name(), nil
	})
	if err != nil {
		t.Errorf("the VM's target pod on %s, admitted under restricted, was not found: %v", target.Name(), err)
	}
}

// restrictedNamespace is a test namespace that enforces Pod Security "restricted", checked by
// the API server's refusal of a privileged pod there.
func restrictedNamespace(t *testing.T) string {
	t.Helper()
	ns := testNamespace(t)
	namespaces := cluster.Kube.CoreV1().Namespaces()
	n, err := namespaces.Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := namespaces.Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	privileged := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "privileged"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}},
	}
	if _, err := cluster.Kube.CoreV1().Pods(ns).Create(context.Background(), privileged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a privileged pod in the namespace: %v; want it refused by Pod Security (restricted)", err)
	}
	return ns
}

// TestARestrictedVMIsReceivedInPostCopy: post-copy without privilege. Both nodes offer
// devices.lifeboat.dev/userfaultfd, so a node-pressure migration's target pod asks for one and is
// admitted under "restricted"; the migration cannot converge before the kubelet's deadline by
// pre-copy (4 MiB/s for a 256 MiB guest, no auto-converge, no pause), so the policy switches it
// to post-copy, which the unprivileged target QEMU receives through /dev/userfaultfd, and the
// guest counts on on the other node.
func TestARestrictedVMIsReceivedInPostCopy(t *testing.T) {
	if _, err := os.Stat(userfaultfdDevice); err != nil {
		t.Skipf("needs %s (Linux 6.1 or later): %v", userfaultfdDevice, err)
	}
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.AllowedNodeDirectories = nil
		c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("4Mi"))
		c.Spec.Migrations.AllowAutoConverge, c.Spec.Migrations.AllowPause = ptr.To(false), ptr.To(false)
		c.Spec.Migrations.AllowPostCopy = ptr.To(true)
	})
	startController(t)
	nodes := startNodes(t, 2)
	ns := restrictedNamespace(t)
	vmi := createVMI(t, ns, newVMI("post-copied", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Memory = resource.MustParse("256Mi")
		v.Spec.Boot.Cmdline += " " + protocol.DirtyParam + "=64M " + protocol.DirtyRateParam + "=8M"
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	before := waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)

	evicted := evict(t, source, vmi)
	moved := waitVMI(t, ns, vmi.Name, evictionMaxPodGracePeriod*time.Second, "the VM on the other node within the kubelet's grace period", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	target := nodeOf(t, nodes, moved)
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)
	m := waitMigrationEnded(t, moved)
	if m.Status.Phase != v1alpha1.MigrationSucceeded || m.Status.Mode != v1alpha1.MigrationModePostCopy || m.Status.TargetProxy == nil || !m.Status.TargetProxy.PostCopy {
		t.Errorf("migration %s: phase %s, mode %s, target proxy %+v; want Succeeded by PostCopy, the target able to receive it", m.Name, m.Status.Phase, m.Status.Mode, m.Status.TargetProxy)
	}
	targetPod, err := cluster.Kube.CoreV1().Pods(ns).Get(context.Background(), m.Status.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := targetPod.Spec.Containers[0].Resources.Limits[v1alpha1.DeviceUserFaultFD]; !ok {
		t.Errorf("target pod %s asks for %v, want %s among them", targetPod.Name, targetPod.Spec.Containers[0].Resources.Limits, v1alpha1.DeviceUserFaultFD)
	}
	checkUnprivileged(t, targetPod, false)
	if err := evicted(); err != nil {
		t.Fatalf("the eviction: %v", err)
	}
}

// checkUnprivileged checks, in /proc, that the launcher of pod runs as the launchers' user with
// no capability and no way to gain one; with seccomp, also that a seccomp filter confines it
// (a real node's runtime applies RuntimeDefault; the emulated node applies no profile).
func checkUnprivileged(t testing.TB, pod *corev1.Pod, seccomp bool) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", launcherPID(t, pod)))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	uid := strconv.Itoa(launcher.UID)
	want := map[string]string{"Uid": strings.Repeat(uid+" ", 3) + uid, "CapEff": "0000000000000000", "CapPrm": "0000000000000000", "NoNewPrivs": "1"}
	if seccomp {
		want["Seccomp"] = "2"
	}
	for k, v := range want {
		if fields[k] != v {
			t.Errorf("launcher of %s: %s is %q, want %q", pod.Name, k, fields[k], v)
		}
	}
}
