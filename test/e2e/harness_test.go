package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/deviceplugin"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// proc is a lifeboat process a test runs, and may kill and start again.
type proc struct {
	name, dir string
	args      []string
	*controlplane.Process
}

func startProc(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, dir: t.TempDir(), args: args}
	p.start(t)
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath())
			t.Logf("%s log:\n%s", name, tail(string(b), failureLogLines))
		}
	})
	return p
}

// start starts the process (again), appending to its log.
func (p *proc) start(t testing.TB) {
	t.Helper()
	var err error
	if p.Process, err = controlplane.StartProcess(p.dir, p.name, filepath.Join(bins, p.name), p.args...); err != nil {
		t.Fatal(err)
	}
}

func (p *proc) stop() { p.Stop(10 * time.Second) }

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func startController(t testing.TB, args ...string) *proc {
	return startProc(t, "lifeboat-controller", append([]string{"--kubeconfig", cluster.Kubeconfig, "--acceleration", "tcg"}, args...)...)
}

type testNode struct {
	*node.Node
	agent   *proc
	metrics string // http://address:port/metrics
}

// withKVM has an emulated node serve the host's /dev/kvm, as its agent's device plugin would
// on a node with KVM, so that launchers started with --acceleration=kvm get it; it skips t
// where /dev/kvm does not open. Only benchmarks call it, and make test runs none.
func withKVM(t testing.TB) func(*node.Config) {
	t.Helper()
	kvm := deviceplugin.KVM.Path
	f, err := os.OpenFile(kvm, os.O_RDWR, 0)
	if err != nil {
		t.Skipf("this needs KVM: %s opened for reading and writing: %v", kvm, err)
	}
	f.Close()
	return func(c *node.Config) { c.Devices[v1alpha1.DeviceKVM] = kvm }
}

// startNodes starts n emulated nodes, each with its agent.
func startNodes(t testing.TB, n int, configure ...func(*node.Config)) []*testNode {
	t.Helper()
	return startNodesWithAgentArgs(t, n, nil, configure...)
}

// podCPUShares is the CPU share of the nodes' pods in benchmarks that boot dozens of TCG guests
// (node.Config.PodCPUShares): a quarter of what one process of the control plane has. On a real
// cluster the API server and etcd have machines of their own; here they share two cores with
// the guests, which starved them until requests timed out (40 VMIs starting, 50 VMs drained).
const podCPUShares = 256

// behindTheControlPlane gives the nodes' pods podCPUShares where this machine can, and says
// what its absence costs where it cannot.
func behindTheControlPlane() func(*node.Config) {
	if err := node.CPUGroupsAvailable(); err != nil {
		fmt.Fprintf(os.Stderr, "the pods share the CPU with the control plane (%v): dozens of TCG guests can starve the API server until requests time out\n", err)
		return func(*node.Config) {}
	}
	return func(c *node.Config) { c.PodCPUShares = podCPUShares }
}

// startNodesWithAgentArgs is startNodes whose agents also get agentArgs(node)'s flags.
func startNodesWithAgentArgs(t testing.TB, n int, agentArgs func(*node.Node) []string, configure ...func(*node.Config)) []*testNode {
	t.Helper()
	withLauncher := func(c *node.Config) {
		c.Binaries = map[string]string{"lifeboat-launcher": filepath.Join(bins, "lifeboat-launcher")}
		c.Capacity = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}
		c.RootDir = shortTempDir(t)
		c.EvictionMaxPodGracePeriod = evictionMaxPodGracePeriod
		c.Images = imageStore
		// What the agent's device plugin serves on a node with the device.
		c.Devices = map[corev1.ResourceName]string{v1alpha1.DeviceTun: "/dev/net/tun"}
		if _, err := os.Stat(userfaultfdDevice); err == nil {
			c.Devices[v1alpha1.DeviceUserFaultFD] = userfaultfdDevice
		}
	}
	var out []*testNode
	// The agent reads the same eviction settings as its node's kubelet has, from a file: an
	// emulated kubelet serves no /configz, and evicts only when a test says so (node.EvictPod), as
	// a soft eviction at its MemoryPressure threshold with its evictionMaxPodGracePeriod.
	kubeletConfig := map[string]string{}
	record := func(c *node.Config) {
		threshold := c.MemoryPressure.Threshold
		if threshold.IsZero() {
			threshold = resource.MustParse("500Mi")
		}
		path := filepath.Join(c.RootDir, "kubelet-config.yaml")
		if err := os.WriteFile(path, fmt.Appendf(nil, "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"+
			"evictionSoft: {memory.available: %s}\nevictionHard: {}\nevictionMaxPodGracePeriod: %d\n", threshold.String(), c.EvictionMaxPodGracePeriod), 0o644); err != nil {
			t.Fatal(err)
		}
		kubeletConfig[c.Name] = path
	}
	configure = append(append([]func(*node.Config){withLauncher}, configure...), record)
	for _, n := range node.StartN(context.Background(), t, cluster.Kube, n, configure...) {
		port := freePort(t, n.Address())
		tn := &testNode{Node: n, metrics: fmt.Sprintf("http://%s:%d/metrics", n.Address(), port)}
		args := []string{"--kubeconfig", cluster.Kubeconfig, "--node-name", n.Name(),
			"--kubelet-port=0", "--kubelet-config", kubeletConfig[n.Name()], "--node-address", n.Address(),
			"--run-dir", n.HostPath("/var/run/lifeboat"), "--listen", fmt.Sprintf("%s:%d", n.Address(), port),
			"--kubelet-pods-dir", n.HostPath("/var/lib/kubelet/pods"), "--launcher-dir-resync", "1s",
			"--cert-dir", filepath.Join(n.HostPath("/var/run/lifeboat"), "pki"),
			// Emulated nodes have no kubelet device manager; the machine's own directory may
			// belong to the real test node's kubelet.
			"--device-plugin-dir="}
		if agentArgs != nil {
			args = append(args, agentArgs(n)...)
		}
		tn.agent = startProc(t, "lifeboat-agent", args...)
		// As the DaemonSet would: the node's QEMU probed once, for every launcher on it.
		if err := n.StartQEMUProbe(t.Context(), qemuProbeManifest); err != nil {
			t.Fatal(err)
		}
		out = append(out, tn)
		t.Cleanup(func() {
			if t.Failed() {
				tn.dumpNodeLogs(t)
			}
		})
	}
	return out
}

// failureLogLines is how much of each log a failed test prints: enough for the whole life of
// a migration in an agent's or a launcher's log, so that CI's output alone explains a failure.
const failureLogLines = 400

// dumpNodeLogs prints, for a failed test, every log the node kept: each container's (pods
// deleted during the test included), each launcher's libvirtd and its QEMUs'. The node's
// directories are removed when the test ends, so this is all that is left of them.
func (n *testNode) dumpNodeLogs(t testing.TB) {
	root := n.RootDir()
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(d.Name(), ".log") || d.Name() == launcher.ConsoleLog {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		t.Logf("%s on %s:\n%s", rel, n.Name(), tail(string(b), failureLogLines))
		return nil
	})
}

// evictionMaxPodGracePeriod is the emulated kubelets' setting, which their agents are told:
// short, so a test can watch a marked VM's deadline pass.
const evictionMaxPodGracePeriod = 12

// userfaultfdDevice is the device a post-copy target's QEMU takes the guest's page faults through.
const userfaultfdDevice = "/dev/userfaultfd"

// shortTempDir is a node root short enough for the unix sockets under it: a socket path may
// not exceed 107 bytes, and t.TempDir's names, which include the test's, can take most of that.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lbn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// vmDir is a directory of this machine for a VM's own files (a claim's volume, boot files a lab
// admin allows), owned by the launchers' user as that admin would make it: launchers do not run
// as root.
func vmDir(t testing.TB) string {
	t.Helper()
	dir := shortTempDir(t)
	if err := os.Chown(dir, launcher.UID, launcher.GID); err != nil {
		t.Fatal(err)
	}
	return dir
}

func freePort(t testing.TB, addr string) int {
	t.Helper()
	l, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// metric reads one sample of the agent's /metrics, e.g. `lifeboat_agent_launchers`.
func (n *testNode) metric(t *testing.T, sample string) float64 {
	t.Helper()
	return metricValue(t, n.metrics, sample)
}

// metricValue reads one sample from a /metrics URL, or -1.
func metricValue(t testing.TB, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`)
	m := re.FindStringSubmatch(string(b))
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

func testNamespace(t testing.TB) string {
	t.Helper()
	ns, err := cluster.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpEvents(t, ns.Name)
		}
		// A VM outlives its test otherwise: its run strategy would start its instance again on the
		// next test's nodes, under the next test's controller.
		if err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns.Name).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the VMs of namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

func dumpEvents(t testing.TB, ns string) {
	events, err := cluster.Kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, e := range events.Items {
		t.Logf("event %s/%s %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
	}
}

func newVMI(name string, mutate ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 1, Memory: resource.MustParse("128Mi"),
			Boot:                          guestBoot(),
			TerminationGracePeriodSeconds: ptr.To[int64](20),
			EvictionStrategy:              ptr.To(v1alpha1.EvictionStrategyNone),
		},
	}
	for _, m := range mutate {
		m(v)
	}
	return v
}

// guestBoot boots the test guest from its kernel image, as a user would: no node path.
func guestBoot() v1alpha1.BootSource {
	return v1alpha1.BootSource{
		Container: &v1alpha1.KernelBootContainer{Image: images.GuestKernelImage, KernelPath: images.GuestKernelPath, InitrdPath: images.GuestInitrdPath},
		Cmdline:   guest.Cmdline,
	}
}

// withContainerDisk gives v the test guest's disk image as a containerDisk volume "data".
func withContainerDisk(v *v1alpha1.VirtualMachineInstance) {
	v.Spec.Disks = append(v.Spec.Disks, v1alpha1.Disk{Name: "data"})
	v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "data", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: images.GuestDiskImage}})
}

// nodeBoot boots the test guest from node files, which only a cluster admin's allow-list permits.
func nodeBoot() v1alpha1.BootSource {
	return v1alpha1.BootSource{Kernel: image.Kernel, Initrd: image.Initrd, Cmdline: guest.Cmdline}
}

// allowNodePaths adds the directories of v's node paths to the LifeboatConfig's allow-list.
func allowNodePaths(t testing.TB, v *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	ctx := context.Background()
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	cfg := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName},
		Spec: v1alpha1.LifeboatConfigSpec{AllowedNodeDirectories: guestDirectories()}}
	if _, err := configs.Create(ctx, cfg, metav1.CreateOptions{}); err == nil {
		t.Cleanup(func() { _ = configs.Delete(context.Background(), v1alpha1.ConfigName, metav1.DeleteOptions{}) })
	} else if !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating the LifeboatConfig: %v", err)
	}
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cfg, err := configs.Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		changed := false
		for _, f := range v1alpha1.NodePaths(v.Spec.Boot) {
			if _, ok := v1alpha1.AllowedDirectory(f.Path, cfg.Spec.AllowedNodeDirectories); !ok {
				cfg.Spec.AllowedNodeDirectories = append(cfg.Spec.AllowedNodeDirectories, filepath.Dir(f.Path))
				changed = true
			}
		}
		if !changed {
			return nil
		}
		_, err = configs.Update(ctx, cfg, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("allowing the node directories of VMI %s: %v", v.Name, err)
	}
}

// guestDirectories are the node directories of the test guest's kernel and initrd, which the
// cluster admin must allow (LifeboatConfig spec.allowedNodeDirectories) for VMIs to boot it.
func guestDirectories() []string {
	dirs := []string{filepath.Dir(image.Initrd)}
	if _, ok := v1alpha1.AllowedDirectory(image.Kernel, dirs); !ok {
		dirs = append(dirs, filepath.Dir(image.Kernel))
	}
	return dirs
}

// createVMI creates v in ns, first allowing the node directories it boots from as a lab admin
// would (a cluster without a LifeboatConfig gets one that allows only those).
func createVMI(t testing.TB, ns string, v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	allowNodePaths(t, v)
	created, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(context.Background(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating VMI %s: %v", v.Name, err)
	}
	return created
}

// waitVMI polls the VMI until cond holds, failing with what was expected and what was seen.
func waitVMI(t testing.TB, ns, name string, timeout time.Duration, what string, cond func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	return kubewait.For(t, timeout, fmt.Sprintf("VMI %s/%s: %s", ns, name, what), func(ctx context.Context) (*v1alpha1.VirtualMachineInstance, error) {
		return cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
	}, cond, describe)
}

// noMigrationsWindow is how long expectNoMigrations watches: longer than the controller takes to
// create a migration for a marked VM.
const noMigrationsWindow = 3 * time.Second

// expectNoMigrations checks, for noMigrationsWindow, that namespace ns holds no migration.
func expectNoMigrations(t testing.TB, ns, why string) {
	t.Helper()
	kubewait.Consistently(t, noMigrationsWindow, why, func(ctx context.Context) error {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) != 0 {
			return fmt.Errorf("migration %s exists, cause %q", list.Items[0].Name, list.Items[0].Status.Cause)
		}
		return nil
	})
}

func describe(v *v1alpha1.VirtualMachineInstance) string {
	if v == nil {
		return "nothing"
	}
	return fmt.Sprintf("phase=%q node=%q reason=%q message=%q conditions=%+v", v.Status.Phase, v.Status.NodeName, v.Status.Reason, v.Status.Message, v.Status.Conditions)
}

func running(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.VMIRunning }

// nodeOf returns the test node the VMI runs on.
func nodeOf(t testing.TB, nodes []*testNode, v *v1alpha1.VirtualMachineInstance) *testNode {
	t.Helper()
	for _, n := range nodes {
		if n.Name() == v.Status.NodeName {
			return n
		}
	}
	t.Fatalf("VMI %s runs on %q, not on a test node", v.Name, v.Status.NodeName)
	return nil
}

// consolePath is where the launcher logs the guest's serial console, seen from the host.
func (n *testNode) consolePath(v *v1alpha1.VirtualMachineInstance) string {
	return filepath.Join(n.HostPath("/var/run/lifeboat"), "domains", string(v.UID), "console.log")
}

// waitCounterPast waits until the guest's counter exceeds n: the guest kept running.
func waitCounterPast(t testing.TB, path string, n int, timeout time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	console, err := guest.WaitForConsole(ctx, path, fmt.Sprintf("a counter above %d", n), func(c string) bool { return guest.Counter(c) > n })
	if err != nil {
		t.Fatal(err)
	}
	return guest.Counter(console)
}

func launcherPod(t testing.TB, v *v1alpha1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	pods, err := cluster.Kube.CoreV1().Pods(v.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one launcher pod for %s: %v, %d pods", v.Name, err, len(pods.Items))
	}
	return &pods.Items[0]
}

func waitEvent(t *testing.T, ns, object, reason string, timeout time.Duration) *corev1.Event {
	t.Helper()
	return kubewait.Event(t, cluster.Kube, ns, fields.Set{"involvedObject.name": object, "reason": reason}, timeout)
}

// launcherPID finds the host pid of the launcher process of a pod, from its environment.
func launcherPID(t testing.TB, pod *corev1.Pod) int {
	t.Helper()
	pid := podProcess(pod, "lifeboat-launcher")
	if pid == 0 {
		t.Fatalf("no lifeboat-launcher process for pod %s", pod.Name)
	}
	return pid
}

// podProcess finds the host pid of the process of a pod whose executable is named exe, from the
// pod name in its environment (which the launcher's libvirtd inherits); 0 if there is none.
func podProcess(pod *corev1.Pod, exe string) int {
	return envProcess(exe, "POD_NAME="+pod.Name)
}

// envProcess is the pid of a process running exe with the variable kv ("NAME=value") in its
// environment; 0 if none.
func envProcess(exe, kv string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		path, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if filepath.Base(path) != exe {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if strings.Contains(string(env), "\x00"+kv+"\x00") || strings.HasPrefix(string(env), kv+"\x00") {
			return pid
		}
	}
	return 0
}
