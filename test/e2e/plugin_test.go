package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// kubectlLifeboat runs `kubectl lifeboat ARGS` through the real kubectl, which finds the plugin
// on PATH as it would on a user's machine.
func kubectlLifeboat(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := kubectlLifeboatCommand(args...).CombinedOutput()
	t.Logf("kubectl lifeboat %s:\n%s", strings.Join(args, " "), out)
	return string(out), err
}

// kubectlLifeboatCommand is `kubectl lifeboat ARGS` with the plugin on PATH and the test
// cluster's kubeconfig, not yet started.
func kubectlLifeboatCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(cluster.Binaries.Dir(), "kubectl"), append([]string{"lifeboat"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig, "PATH="+bins+string(os.PathListSeparator)+os.Getenv("PATH"))
	return cmd
}

func mustKubectlLifeboat(t *testing.T, want string, args ...string) {
	t.Helper()
	out, err := kubectlLifeboat(t, args...)
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("kubectl lifeboat %s: %v; want output saying %q", strings.Join(args, " "), err, want)
	}
}

// The plugin stops, starts, restarts and migrates a VM, and tells its story; its errors name the
// VM and what to do.
func TestKubectlLifeboat(t *testing.T) {
	setConfig(t, true)
	startController(t)
	startNodes(t, 2)
	ns := testNamespace(t)
	vm := newVM("managed", v1alpha1.RunStrategyAlways)
	vm.Spec.Template.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	allowNodePaths(t, &v1alpha1.VirtualMachineInstance{Spec: vm.Spec.Template.Spec})
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(ns).Create(context.Background(), vm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitVMI(t, ns, vm.Name, bootTimeout, "Running", running)
	waitVM(t, ns, vm.Name, 30*time.Second, "Running", func(v *v1alpha1.VirtualMachine) bool {
		return v.Status.PrintableStatus == v1alpha1.PrintableStatusRunning
	})
	mustKubectlLifeboat(t, "VM "+ns+"/managed: Running, ready true, run strategy Always", "status", vm.Name, "-n", ns)
	// What protects it and what would happen to it (issue 46): the sections and the strategy's origin.
	for _, want := range []string{"Protected by:\n", "  eviction strategy LiveMigrate, from the VMI's spec.evictionStrategy\n",
		"  live migration: possible\n", "If its node were drained:\n  ", "If its node ran out of memory:\n  "} {
		mustKubectlLifeboat(t, want, "status", vm.Name, "-n", ns)
	}

	mustKubectlLifeboat(t, "was scheduled to stop", "stop", vm.Name, "-n", ns)
	waitVM(t, ns, vm.Name, time.Minute, "Stopped, Halted, its instance gone", func(v *v1alpha1.VirtualMachine) bool {
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), vm.Name, metav1.GetOptions{})
		return v.Spec.RunStrategy == v1alpha1.RunStrategyHalted && v.Status.PrintableStatus == v1alpha1.PrintableStatusStopped && apierrors.IsNotFound(err)
	})
	if out, err := kubectlLifeboat(t, "stop", vm.Name, "-n", ns); err == nil || !strings.Contains(out, "VM "+ns+"/managed is halted already") {
		t.Errorf("stopping a halted VM: %v; want an error saying it is halted already", err)
	}

	mustKubectlLifeboat(t, "was scheduled to start", "start", vm.Name, "-n", ns)
	started := waitVMI(t, ns, vm.Name, bootTimeout, "Running again", func(v *v1alpha1.VirtualMachineInstance) bool { return running(v) && v.UID != first.UID })

	mustKubectlLifeboat(t, "was scheduled to restart", "restart", vm.Name, "-n", ns)
	restarted := waitVMI(t, ns, vm.Name, bootTimeout, "Running as a new instance", func(v *v1alpha1.VirtualMachineInstance) bool { return running(v) && v.UID != started.UID })

	// migrate --wait follows the migration to its end (issue 46, 4), piped: a line per change,
	// then where the VM runs and how long the guest stood still, as the target's agent recorded it.
	out, err := kubectlLifeboat(t, "migrate", vm.Name, "-n", ns, "--wait", "--timeout", (2 * bootTimeout).String())
	if err != nil || !strings.Contains(out, "is migrating from node "+restarted.Status.NodeName) || !strings.Contains(out, ": Succeeded ") ||
		!strings.Contains(out, "now runs on node ") || !strings.Contains(out, "the guest stood still for ") {
		t.Fatalf("kubectl lifeboat migrate --wait: %v; want it to say the VM migrates, the migration's lines, where it runs now and how long the guest stood still", err)
	}
	moved := waitVMI(t, ns, vm.Name, 2*bootTimeout, "on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID == restarted.UID && v.Status.NodeName != restarted.Status.NodeName && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	if !strings.Contains(out, "now runs on node "+moved.Status.NodeName+":") {
		t.Errorf("kubectl lifeboat migrate --wait did not say the VM runs on node %s now", moved.Status.NodeName)
	}
	if moved.Status.MigrationState.Cause != v1alpha1.MigrationCauseManual {
		t.Errorf("the plugin's migration has cause %q, want Manual", moved.Status.MigrationState.Cause)
	}
	// libvirt's figure, which the target's agent records a moment after the guest runs there.
	stood := waitVMI(t, ns, vm.Name, 30*time.Second, "with the guest's downtime recorded", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.MigrationState != nil && v.Status.MigrationState.DowntimeMilliseconds != nil
	})
	t.Logf("the guest stood still for %d ms", *stood.Status.MigrationState.DowntimeMilliseconds)
	mustKubectlLifeboat(t, "cause Manual", "status", vm.Name, "-n", ns)

	for _, tc := range []struct{ args []string }{
		{[]string{"start", "missing", "-n", ns}},
		{[]string{"evacuate-cancel", vm.Name, "-n", ns}},
		{[]string{"start", vm.Name, "-n", ns}},
	} {
		out, err := kubectlLifeboat(t, tc.args...)
		if err == nil || !strings.Contains(out, "error: VM "+ns+"/"+tc.args[1]) {
			t.Errorf("kubectl lifeboat %s: %v; want an error that names the VM", strings.Join(tc.args, " "), err)
		}
	}
}
