// Package demo runs make demo as a new user does, then uses the cluster it leaves running the
// way the README invites: an admin drains the VM's node, and lifeboat must move the VM.
package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
)

func TestDemoClusterMovesTheVMOnADrain(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// A cluster of the test's own, beside any demo the user keeps running; the nodes' root is
	// short because the launchers' sockets live under it.
	dir := filepath.Join(t.TempDir(), "cluster")
	nodes, err := os.MkdirTemp("/tmp", "lbd")
	if err != nil {
		t.Fatal(err)
	}
	vars := []string{"DEMO_DIR=" + dir, "DEMO_NODES=" + nodes}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir, nodes)
		}
		if out, err := makeIn(root, time.Minute, append([]string{"demo-down"}, vars...)...); err != nil {
			t.Errorf("make demo-down: %v\n%s", err, out)
		}
		_ = os.RemoveAll(nodes)
	})

	// make demo takes 1 to 3 minutes here, building nothing (make test built the binaries
	// first); its own steps have deadlines, and this one says which step ran out if one did not.
	out, err := makeIn(root, demoTimeout, append([]string{"demo"}, vars...)...)
	if err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	// The guest answers through its Service before the eviction, and the client that asked all
	// through the migration saw one boot of it. kubectl lifeboat follow tells the migration, to
	// where the VM runs now and libvirt's figure of how long the guest stood still; the harness,
	// from the consoles on the nodes' disks, that the guest's counter went on without a reboot
	// and its longest silence ("the guest stood still for ... at most").
	for _, want := range []string{"lifeboat-guest user-data: #cloud-config", "lifeboat-guest disk vda: journal 1..5 intact",
		"following VM default/demo, running on node ", "  migration ", "VM default/demo now runs on node ", "(libvirt's figure, recorded by node ",
		"without a reboot", "the guest stood still for", "evicting pod default/", "drained",
		"default/demo answers: lifeboat-guest boot ", "answered, from 1 boot(s) of the guest",
		"VM default/demo: Running, ready true, run strategy Always, 0 restart(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("make demo's story lacks %q; it printed:\n%s", want, out)
		}
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	lb := lifeboatclient.NewForConfigOrDie(cfg)
	vmis := lb.LifeboatV1alpha1().VirtualMachineInstances("default")
	ctx := context.Background()
	before, err := vmis.Get(ctx, "demo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from := before.Status.NodeName

	// What the README says a user may do next: drain the VM's node.
	bins, err := controlplane.EnsureBinaries(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	// What the README says an admin runs whenever in doubt: the check passes, its controller
	// line saying who leads.
	checkCmd := exec.Command(filepath.Join(bins.Dir(), "kubectl"), "lifeboat", "check")
	checkCmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "admin.kubeconfig"), "PATH="+filepath.Join(root, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	checked, err := checkCmd.CombinedOutput()
	t.Logf("kubectl lifeboat check:\n%s", checked)
	if err != nil || !strings.Contains(string(checked), "\nok      controller: ") || !strings.Contains(string(checked), " 0 fail, ") {
		t.Errorf("kubectl lifeboat check on the demo cluster: %v; want exit 0, an ok controller line and 0 fail; it printed:\n%s", err, checked)
	}

	// What the closing lines invite: the launchers' logs, a command in the VM's launcher
	// container and the guest's console, all through the nodes' kubelet API.
	kubectl := func(args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bins.Dir(), "kubectl"), args...)
		cmd.Env = checkCmd.Env
		return cmd
	}
	logs, err := kubectl("logs", "-l", v1alpha1.LabelVMIName+"=demo", "--prefix", "--tail=20").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(logs)) == 0 {
		t.Errorf("kubectl logs of the VM's launchers: %v; want their logs, got:\n%s", err, logs)
	}
	launcher, err := kubectl("get", "pods", "-l", v1alpha1.LabelVMIName+"=demo", "--field-selector=status.phase=Running", "-o", "name").Output()
	if err != nil || len(strings.Fields(string(launcher))) != 1 {
		t.Errorf("the VM's running launcher pod: %v, %q; want one", err, launcher)
	} else if id, err := kubectl("exec", strings.TrimSpace(string(launcher)), "--", "id").CombinedOutput(); err != nil || !strings.Contains(string(id), "uid=") {
		t.Errorf("kubectl exec %s -- id: %v; it printed %q", strings.TrimSpace(string(launcher)), err, id)
	}
	if err := guest.Exchange(kubectl("lifeboat", "console", "demo"), "hello from the demo test", time.Minute); err != nil {
		t.Error(err)
	}

	drain := exec.Command(filepath.Join(bins.Dir(), "kubectl"), "--kubeconfig", filepath.Join(dir, "admin.kubeconfig"),
		"drain", from, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
	drained, err := drain.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", from, err, drained)
	}
	if !strings.Contains(string(drained), webhook.EvacuationText) {
		t.Errorf("kubectl drain %s never met the eviction webhook's %q; it printed:\n%s", from, webhook.EvacuationText, drained)
	}
	var after *v1alpha1.VirtualMachineInstance
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		after, err = vmis.Get(ctx, "demo", metav1.GetOptions{})
		return err == nil && after.Status.Phase == v1alpha1.VMIRunning && after.Status.NodeName != "" &&
			after.Status.NodeName != from && after.Status.EvacuationNodeName == "", nil
	})
	if err != nil {
		t.Fatalf("after draining %s the VM should run on the other node with no evacuation mark; it has phase %q on %q, mark %q",
			from, after.Status.Phase, after.Status.NodeName, after.Status.EvacuationNodeName)
	}
	if after.UID != before.UID {
		t.Errorf("the drain replaced the VMI (uid %s, was %s) instead of moving it", after.UID, before.UID)
	}
}

// demoTimeout bounds make demo: several times its longest run on a loaded 2-core machine.
const demoTimeout = 15 * time.Minute

// makeIn runs make in dir with args and returns what it printed. Past timeout it stops make and
// everything make started (SIGTERM to the process group), and returns what they had printed; a
// process that outlives make holding its output is not waited for.
func makeIn(dir string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("make %s did not finish within %s (%v); the last command it ran is the last '+' line below", args[0], timeout, err)
	}
	return out.String(), err
}

// dumpLogs prints the tail of every log the demo cluster kept: the control plane's and the
// controller's in dir, each node's agent, containers and libvirt daemons under nodes. Both are
// removed when the test ends, so a CI log holds all that is left of them.
func dumpLogs(t *testing.T, dirs ...string) {
	for _, root := range dirs {
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(d.Name(), ".log") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil || len(b) == 0 {
				return nil
			}
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			lines = lines[max(0, len(lines)-logLines):]
			t.Logf("%s (last %d lines):\n%s", path, len(lines), strings.Join(lines, "\n"))
			return nil
		})
	}
}

// logLines is how much of each log a failed run prints.
const logLines = 200
