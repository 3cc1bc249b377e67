package guest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// metaPackage is Debian's package that depends on the current cloud kernel; the cloud
// flavour boots quickly and has virtio and the serial console built in.
const metaPackage = "linux-image-cloud-amd64"

// guestModules are the modules init needs that the cloud kernel does not build in: the
// ACPI button driver turns the power button into an input device and evdev lets init read it;
// virtio_pci and virtio_blk find the disks, isofs reads the cloud-init seed, virtio_net is the
// network card (the DHCP client's packet sockets, CONFIG_PACKET, are built in).
var guestModules = []string{"button", "evdev", "virtio_pci", "virtio_blk", "isofs", "virtio_net"}

// kernel is one cached kernel: <cache>/<package>-modules-<hash>/vmlinuz and the modules the
// guest loads, in its modules directory with their load order in the file "order".
type kernel struct{ dir string }

func (k kernel) vmlinuz() string    { return filepath.Join(k.dir, "vmlinuz") }
func (k kernel) modulesDir() string { return filepath.Join(k.dir, "modules") }

// modules are the names of the cached modules in load order.
func (k kernel) modules() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(k.modulesDir(), "order"))
	if err != nil {
		return nil, fmt.Errorf("reading the guest kernel's module order: %w", err)
	}
	return strings.Fields(string(b)), nil
}

// ensureKernel returns the current cloud kernel, fetching it first if it is not cached. Package
// lists that are missing or older than the mirror (a kernel no longer there) are refreshed once.
func ensureKernel(ctx context.Context, cache string, progress io.Writer) (kernel, error) {
	k, err := ensureKernelFromLists(ctx, cache, progress)
	if err == nil {
		return k, nil
	}
	fmt.Fprintf(progress, "%v\nrefreshing apt's package lists and trying again\n", err)
	if _, uerr := run(exec.CommandContext(ctx, "apt-get", "update", "-q")); uerr != nil {
		return kernel{}, fmt.Errorf("%w (and apt-get update failed: %v)", err, uerr)
	}
	return ensureKernelFromLists(ctx, cache, progress)
}

// ensureKernelFromLists is ensureKernel with apt's package lists as they are.
func ensureKernelFromLists(ctx context.Context, cache string, progress io.Writer) (kernel, error) {
	pkg, err := resolveKernelPackage(ctx)
	if err != nil {
		return kernel{}, err
	}
	// The modules kept are part of the cache's name: a changed list fetches again.
	sum := sha256.Sum256([]byte(strings.Join(guestModules, "\n")))
	k := kernel{dir: filepath.Join(cache, fmt.Sprintf("%s-modules-%x", pkg, sum[:4]))}
	if exists(k.dir) {
		return k, nil
	}
	unlock, err := lockCache(cache)
	if err != nil {
		return kernel{}, err
	}
	defer unlock()
	if exists(k.dir) {
		return k, nil
	}
	fmt.Fprintf(progress, "fetching %s for the test guest (once; cached in %s)\n", pkg, cache)
	if err := fetchKernel(ctx, pkg, k.dir); err != nil {
		return kernel{}, fmt.Errorf("fetching the test guest kernel %s: %w", pkg, err)
	}
	return k, nil
}

// resolveKernelPackage asks apt which real kernel package the metapackage depends on now.
func resolveKernelPackage(ctx context.Context) (string, error) {
	out, err := run(exec.CommandContext(ctx, "apt-cache", "depends", metaPackage))
	if err != nil {
		return "", fmt.Errorf("resolving %s with apt-cache (are the apt package lists missing? run apt-get update): %w", metaPackage, err)
	}
	return kernelPackage(out)
}

// kernelPackage picks the kernel package out of the output of `apt-cache depends` for the metapackage.
func kernelPackage(dependsOutput string) (string, error) {
	for _, line := range strings.Split(dependsOutput, "\n") {
		dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends:")
		if !ok {
			continue
		}
		dep = strings.TrimSpace(dep)
		if strings.HasPrefix(dep, "linux-image-") && !strings.ContainsAny(dep, "<> ") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("apt-cache depends %s names no linux-image package (run apt-get update?); it said:\n%s", metaPackage, dependsOutput)
}

// fetchKernel downloads pkg with apt-get download, unpacks it with dpkg-deb and keeps the
// kernel and the guest's modules in dest, which appears whole or not at all.
func fetchKernel(ctx context.Context, pkg, dest string) error {
	work, err := os.MkdirTemp(filepath.Dir(dest), ".fetch-"+pkg+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	// The sandbox user _apt cannot write to a private temporary directory; root needs no sandbox.
	download := exec.CommandContext(ctx, "apt-get", "download", "-o", "APT::Sandbox::User=root", pkg)
	download.Dir = work
	if _, err := run(download); err != nil {
		return err
	}
	debs, err := filepath.Glob(filepath.Join(work, "*.deb"))
	if err != nil || len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files, want 1", pkg, len(debs))
	}
	root := filepath.Join(work, "root")
	if _, err := run(exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], root)); err != nil {
		return err
	}

	image := filepath.Join(work, "image")
	k := kernel{dir: image}
	if err := os.MkdirAll(k.modulesDir(), 0o755); err != nil {
		return err
	}
	vmlinuz, err := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil || len(vmlinuz) != 1 {
		return fmt.Errorf("%s has %d boot/vmlinuz-* files, want 1", pkg, len(vmlinuz))
	}
	if err := os.Rename(vmlinuz[0], k.vmlinuz()); err != nil {
		return err
	}
	if err := keepModules(root, k); err != nil {
		return err
	}
	return os.Rename(image, dest)
}

// keepModules moves guestModules and their dependencies from the unpacked package at root
// into k, and records their load order.
func keepModules(root string, k kernel) error {
	trees, err := filepath.Glob(filepath.Join(root, "lib", "modules", "*"))
	if err != nil || len(trees) != 1 {
		return fmt.Errorf("the kernel package has %d lib/modules/* trees, want 1", len(trees))
	}
	mods, err := indexModules(trees[0])
	if err != nil {
		return err
	}
	order, err := loadOrder(guestModules, mods.builtin, mods.depends)
	if err != nil {
		return err
	}
	for _, name := range order {
		if err := os.Rename(mods.files[name], filepath.Join(k.modulesDir(), name+".ko")); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(k.modulesDir(), "order"), []byte(strings.Join(order, "\n")+"\n"), 0o644)
}

// run runs cmd and returns its standard output; its error carries the standard error.
func run(cmd *exec.Cmd) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return "", fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	return stdout.String(), nil
}
