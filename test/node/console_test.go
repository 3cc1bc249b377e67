package node

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// consoleHelperCommand is the test binary as a launcher pod's command that plays the guest.
const consoleHelperCommand = "guest-console"

// consoleHelper plays what the console needs of a launcher pod: "serve" answers each line on
// the launcher's console socket as the test guest does (after "listening" on stdout); "addrs"
// prints the addresses of the network namespace it runs in.
func consoleHelper(args []string) int {
	switch {
	case len(args) == 1 && args[0] == "serve":
		l, err := net.Listen("unix", filepath.Join(contract.PodRunDir, contract.ConsoleSocket))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("listening")
		for {
			conn, err := l.Accept()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			lines := bufio.NewScanner(conn)
			for lines.Scan() {
				fmt.Fprintln(conn, protocol.Heard(lines.Text()))
			}
			conn.Close()
		}
	case len(args) == 1 && args[0] == "addrs":
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for _, a := range addrs {
			fmt.Println(a)
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "usage: %s serve|addrs\n", consoleHelperCommand)
	return 2
}

// TestKubectlLifeboatConsoleThroughTheNode: `kubectl lifeboat console` reaches a launcher pod's
// console through pods/exec on an emulated node, as on make demo's cluster: the real plugin and
// the real `lifeboat-launcher console` in the launcher container (on the pod network, in its
// network namespace), with the test binary in the guest's place.
func TestKubectlLifeboatConsoleThroughTheNode(t *testing.T) {
	t.Parallel()
	bins := t.TempDir()
	build := controlplane.GoBuild{Out: bins + string(filepath.Separator), Packages: []string{"./cmd/lifeboat-launcher", "./cmd/kubectl-lifeboat"}}
	if err := build.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ns := testNamespace(t)
	network := NewTestNetwork(t)
	node := StartN(t.Context(), t, cluster.Kube, 1, OnNetwork(network), func(c *Config) {
		c.Binaries = map[string]string{consoleHelperCommand: self, contract.Command: filepath.Join(bins, contract.Command)}
	})[0]

	// A running VMI on the node, whose launcher pod the test makes: no controller runs here.
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	vmi, err := vmis.Create(t.Context(), &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 1, Memory: resource.MustParse("128Mi"),
			Boot:             v1alpha1.BootSource{Kernel: "/var/lib/lifeboat/vmlinuz", Initrd: "/var/lib/lifeboat/initrd.gz", Cmdline: "console=ttyS0"},
			EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIRunning, node.Name()
	if vmi, err = vmis.UpdateStatus(t.Context(), vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := shPod(node, "launcher", "")
	pod.Labels = map[string]string{v1alpha1.LabelVMIUID: string(vmi.UID)}
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(vmi, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
	c := &pod.Spec.Containers[0]
	c.Name, c.Command = contract.ContainerName, []string{consoleHelperCommand, "serve"}
	pod.Spec.Volumes = []corev1.Volume{{Name: contract.RunVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: contract.RunVolume, MountPath: contract.PodRunDir}}
	pod = createPod(t, ns, pod)
	pod = waitForPod(t, ns, pod.Name, "Ready", isReady)
	waitForLog(t, node, pod, contract.ContainerName, "listening\n")

	// An exec'd command is in the pod's network namespace.
	addrs, err := cluster.Kubectl(t.Context(), "exec", "-n", ns, pod.Name, "--", consoleHelperCommand, "addrs")
	if err != nil || pod.Status.PodIP == "" || pod.Status.PodIP == node.Address() || !strings.Contains(addrs, pod.Status.PodIP+"/") {
		t.Errorf("an exec'd command's addresses: %v, %q; want the pod's, %s", err, addrs, pod.Status.PodIP)
	}

	console := exec.CommandContext(t.Context(), cluster.Binaries.Kubectl, "lifeboat", "console", vmi.Name, "-n", ns)
	console.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig,
		"PATH="+bins+string(os.PathListSeparator)+filepath.Dir(cluster.Binaries.Kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	if err := guest.Exchange(console, "hello through the node", waitTimeout); err != nil {
		t.Error(err)
	}
}
