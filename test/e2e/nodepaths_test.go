package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A VMI that names a file inside an allowed node directory, which is a symlink out of it: the API
// server and the controller cannot see where it leads, the launcher on the node can and refuses
// it (launcher.CheckNodePaths). The VMI fails, the guest never boots, and the launcher's log says why.
func TestTheLauncherRefusesASymlinkOutOfAnAllowedDirectory(t *testing.T) {
	allowed := vmDir(t)
	link := filepath.Join(allowed, "vmlinuz")
	// A real kernel, so that only the symlink check can stop it.
	if err := os.Symlink(image.Kernel, link); err != nil {
		t.Fatal(err)
	}
	setConfig(t, false, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.AllowedNodeDirectories = append(c.Spec.AllowedNodeDirectories, allowed)
	})
	startController(t)
	n := startNodes(t, 1)[0]
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("symlink", func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Boot = nodeBoot()
		v.Spec.Boot.Kernel = link
	}))
	vmi = waitVMI(t, ns, vmi.Name, time.Minute, "phase Failed", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.VMIFailed })

	pod := launcherPod(t, vmi)
	log, err := n.ContainerLog(pod, "compute")
	if err != nil {
		t.Fatal(err)
	}
	want := `boot.kernel \"` + link + `\" resolves to \"` + image.Kernel + `\", out of the allowed node directory ` + allowed
	if !strings.Contains(log, want) {
		t.Errorf("the launcher's log does not say %s; it says:\n%s", want, log)
	}
	if _, err := os.Stat(n.consolePath(vmi)); err == nil {
		t.Errorf("the refused guest has a console log at %s: it was started", n.consolePath(vmi))
	}
}
