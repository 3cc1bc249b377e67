// Package e2e runs lifeboat end to end on the local control plane: the real controller and
// agents as processes, emulated nodes running real launchers, real libvirt and QEMU, and a real
// Linux guest.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

var (
	cluster *controlplane.ControlPlane
	image   guest.Image
	// bins holds lifeboat-agent, lifeboat-controller and lifeboat-launcher, built for this run.
	bins string
	// probe is a copy of this test binary that launchers' users may run (maybeRunProbe).
	probe string
	// imageStore is the emulated nodes' image store (in bins): the test guest's images.
	imageStore string
	// qemuProbeManifest is manifests/qemu-probe.yaml, whose pod each emulated node runs.
	qemuProbeManifest string
)

func TestMain(m *testing.M) {
	node.MaybeRunShim()
	maybeRunProbe()
	maybeForge()
	if err := prepare(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	controlplane.Main(runThenRemove{m, bins}, &cluster, controlplane.Options{})
}

// runThenRemove runs the tests, then removes dir (the binaries and images built for them, about
// 700 MB): Main ends the process with os.Exit, so a deferred removal would never run.
type runThenRemove struct {
	m   *testing.M
	dir string
}

func (r runThenRemove) Run() int {
	defer os.RemoveAll(r.dir)
	return r.m.Run()
}

func prepare() error {
	var err error
	if image, err = guest.Ensure(context.Background(), os.Stderr); err != nil {
		return fmt.Errorf("preparing the test guest: %w", err)
	}
	if bins, err = os.MkdirTemp("", "lifeboat-e2e-bin-*"); err != nil {
		return err
	}
	// Launchers run as their own unprivileged user (api/launcher UID): the guest files that
	// node-path tests boot must be open to it, as a lab admin's would be (the guest's build
	// cache is root's own), and so must the probe it runs as that user.
	if err := os.Chmod(bins, 0o755); err != nil {
		return err
	}
	if image, err = openCopy(image, filepath.Join(bins, "guest")); err != nil {
		return err
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return err
	}
	probe = filepath.Join(bins, "e2e-probe")
	if err := os.WriteFile(probe, self, 0o755); err != nil {
		return err
	}
	imgs, err := images.GuestImages(image)
	if err != nil {
		return fmt.Errorf("the test guest's images: %w", err)
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	qemuProbeManifest = filepath.Join(root, "manifests", "qemu-probe.yaml")
	imageStore = filepath.Join(bins, "images")
	if err := images.WriteStore(imageStore, imgs); err != nil {
		return err
	}
	return controlplane.GoBuild{Out: bins + string(filepath.Separator), Packages: []string{"./cmd/..."}, Output: os.Stderr}.Run(context.Background())
}

// openCopy copies the guest's files into dir, readable by every user.
func openCopy(img guest.Image, dir string) (guest.Image, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return img, err
	}
	out := guest.Image{Kernel: filepath.Join(dir, filepath.Base(img.Kernel)), Initrd: filepath.Join(dir, filepath.Base(img.Initrd))}
	for from, to := range map[string]string{img.Kernel: out.Kernel, img.Initrd: out.Initrd} {
		b, err := os.ReadFile(from)
		if err != nil {
			return img, err
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			return img, err
		}
	}
	return out, nil
}
