package agent

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// QEMUProbeFiles are where the node's QEMU probe pods (contract.QEMUProbeApp) wrote their file,
// as the agent sees it through the kubelet's pod directory: the newest running pod's first, as
// a rolling update of the DaemonSet starts a new pod (a new launcher image) beside the old one.
// pods are those in lifeboat's namespace on this node with the probe's label: only lifeboat and
// the cluster admin make pods there, so the file is lifeboat's own code's.
func QEMUProbeFiles(pods []*corev1.Pod, kubeletPodsDir string) []string {
	running := slices.DeleteFunc(slices.Clone(pods), func(p *corev1.Pod) bool { return p.Status.Phase != corev1.PodRunning })
	slices.SortFunc(running, func(a, b *corev1.Pod) int {
		return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	var files []string
	for _, p := range running {
		files = append(files, filepath.Join(kubeletPodsDir, string(p.UID), "volumes", "kubernetes.io~empty-dir", contract.QEMUProbeVolume, contract.QEMUProbeFile))
	}
	return files
}

// QEMUCapabilities gives each launcher that asks a copy of the QEMU capabilities that the
// node's probe wrote (the first of files() that exists), so that the launcher's libvirtd starts
// without probing QEMU. The files are looked for at each request: the probe may finish after
// the agent starts, and a new launcher image brings a new probe pod.
//
// The copy is a memory file of the launcher's own: nothing it does to it reaches the probe's
// file or another launcher. Nothing goes the other way: a launcher's libvirt runs beside a
// guest that may have taken over its QEMU, and a file from there could tell every libvirt on
// the node what to believe of QEMU.
func QEMUCapabilities(files func() []string) func() (*os.File, error) {
	return func() (*os.File, error) {
		for _, path := range files() {
			src, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			defer src.Close()
			return memoryCopy(src, path)
		}
		return nil, fmt.Errorf("the node's QEMU probe has written no capabilities (no running pod of the DaemonSet %s on this node, or it is still probing)", contract.QEMUProbeApp)
	}
}

// memoryCopy is a memory file holding what src holds, at most domain.MaxQEMUCapabilities.
func memoryCopy(src io.Reader, name string) (*os.File, error) {
	fd, err := unix.MemfdCreate("qemu-capabilities", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("a memory file for the QEMU capabilities: %w", err)
	}
	f := os.NewFile(uintptr(fd), "qemu-capabilities")
	n, err := io.Copy(f, io.LimitReader(src, domain.MaxQEMUCapabilities+1))
	if err == nil && n > domain.MaxQEMUCapabilities {
		err = fmt.Errorf("%s is larger than %d bytes", name, domain.MaxQEMUCapabilities)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
