package images

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// out holds the archives Build writes, once for all tests of the package.
var built struct {
	once sync.Once
	out  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.out != "" {
		_ = os.RemoveAll(built.out)
	}
	os.Exit(code)
}

func archives(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.out, built.err = os.MkdirTemp("", "lifeboat-images-*"); built.err == nil {
			built.err = Build(context.Background(), built.out, os.Stderr)
		}
	})
	if built.err != nil {
		t.Fatalf("building the images: %v", built.err)
	}
	return built.out
}

// readArchive opens a built archive as an OCI image layout and returns its one image and the
// annotations it is listed with.
func readArchive(t *testing.T, path string) (v1.Image, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-xf", path, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v: %s", path, err, out)
	}
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s is not an OCI image layout: %v", path, err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 {
		t.Fatalf("%s lists %d images, want 1", path, len(manifest.Manifests))
	}
	desc := manifest.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("%s: media type %s, want %s", path, desc.MediaType, types.OCIManifestSchema1)
	}
	img, err := index.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, desc.Annotations
}

// Each archive is an OCI layout whose image is named for containerd, runs its binary, and whose
// every blob matches its digest.
func TestArchivesAreValidOCIImages(t *testing.T) {
	out := archives(t)
	for _, c := range Components {
		t.Run(c.Name, func(t *testing.T) {
			img, annotations := readArchive(t, filepath.Join(out, c.Archive()))
			if got := annotations[AnnotationImageName]; got != c.Ref() {
				t.Errorf("annotation %s = %q, want %q", AnnotationImageName, got, c.Ref())
			}
			if err := validate.Image(img); err != nil {
				t.Errorf("invalid image: %v", err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{binDir + "/" + c.Name}; strings.Join(cfg.Config.Entrypoint, " ") != strings.Join(want, " ") {
				t.Errorf("entrypoint %q, want %q", cfg.Config.Entrypoint, want)
			}
			if cfg.OS != "linux" || cfg.Architecture != "amd64" {
				t.Errorf("platform %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
			}
		})
	}
}

// checks are commands each image must run: the binary (the agent and the launcher find their
// shared libraries in the Debian layer); in the launcher's, the libvirtd and QEMU it runs and the
// group and user libvirtd will not start without. The controller's image has no shell.
var checks = map[string][][]string{
	"lifeboat-controller": {{"/usr/local/bin/lifeboat-controller", "-h"}},
	"lifeboat-agent":      {{"lifeboat-agent", "-h"}},
	"lifeboat-launcher": {
		{"lifeboat-launcher", "-h"},
		{"libvirtd", "--version"},
		{"qemu-system-x86_64", "--version"},
		{"qemu-img", "--version"},
		{"getent", "group", "kvm"},
		{"getent", "passwd", "libvirt-qemu"},
	},
}

// The images' programs run in their unpacked root filesystems.
func TestImagesRunTheirPrograms(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("running programs in an image's root filesystem needs chroot, which needs root (the README's prerequisites)")
	}
	out := archives(t)
	for _, c := range Components {
		t.Run(c.Name, func(t *testing.T) {
			img, _ := readArchive(t, filepath.Join(out, c.Archive()))
			root := unpack(t, img)
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			for _, argv := range checks[c.Name] {
				cmd := exec.Command("chroot", append([]string{root}, argv...)...)
				cmd.Env = cfg.Config.Env
				output, err := cmd.CombinedOutput()
				if err != nil {
					t.Errorf("in the %s image, %s: %v\n%s", c.Name, strings.Join(argv, " "), err, output)
					continue
				}
				t.Logf("%s: %s", strings.Join(argv, " "), firstLine(output))
			}
		})
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// unpack writes the image's flattened filesystem into a new directory.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	fs := mutate.Extract(img)
	defer fs.Close()
	cmd := exec.Command("tar", "-x", "-C", root)
	cmd.Stdin = fs
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpacking the image: %v: %s", err, output)
	}
	return root
}

// containerd, as a node runs it, imports every archive under the image's name and unpacks it.
func TestContainerdImports(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("containerd needs root (the README's prerequisites)")
	}
	out := archives(t)
	ctr := startContainerd(t)
	for _, c := range Components {
		if output, err := ctr("-n", "k8s.io", "images", "import", filepath.Join(out, c.Archive())); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", c.Archive(), err, output)
		}
	}
	listed, err := ctr("-n", "k8s.io", "images", "list", "-q")
	if err != nil {
		t.Fatalf("ctr images list: %v\n%s", err, listed)
	}
	for _, c := range Components {
		if !strings.Contains("\n"+listed, "\n"+c.Ref()+"\n") {
			t.Errorf("containerd lists no %s after the import; it has:\n%s", c.Ref(), listed)
		}
		// Unpacked into the snapshotter, as the kubelet needs before it can start a container.
		if output, err := ctr("-n", "k8s.io", "images", "check", "name=="+c.Ref()); err != nil || !strings.Contains(output, "complete") {
			t.Errorf("ctr images check %s: %v\n%s", c.Ref(), err, output)
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Fatalf("running the imported images needs runc (Debian package runc, which .ci/run installs): %v", err)
	}
	for _, c := range Components {
		for i, argv := range checks[c.Name] {
			// A container of the image, as containerd runs it for the kubelet (runc, the image's
			// config), with its own network namespace.
			id := fmt.Sprintf("%s-%d", c.Name, i)
			output, err := ctr(append([]string{"-n", "k8s.io", "run", "--rm", c.Ref(), id}, argv...)...)
			if err != nil {
				t.Errorf("in a %s container, %s: %v\n%s", c.Name, strings.Join(argv, " "), err, output)
				continue
			}
			t.Logf("container %s: %s: %s", c.Name, strings.Join(argv, " "), firstLine([]byte(output)))
		}
	}
}

// startContainerd runs a private containerd (its own root, state and socket, no CRI) for the
// test and returns a ctr bound to it.
func startContainerd(t *testing.T) func(args ...string) (string, error) {
	t.Helper()
	// The real test node's containerd (test/realnode), built from the pinned Go modules.
	bin, err := controlplane.EnsureContainerd(t.Context(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	// Short: the socket path may not exceed 107 bytes.
	dir, err := os.MkdirTemp("", "lbctd")
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "c.sock")
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, socket+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "containerd"), "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("containerd log:\n%s", b)
		}
		_ = os.RemoveAll(dir)
	})
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(bin, "ctr"), append([]string{"--address", socket}, args...)...).CombinedOutput()
		return string(out), err
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := ctr("version")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("containerd did not answer on %s: %v", socket, err)
	}
	return ctr
}

// The same checkout and cached Debian layer give the same bytes: a node that already has an
// image keeps it when it is built again.
func TestBuildsAreReproducible(t *testing.T) {
	first := archives(t)
	second := t.TempDir()
	if err := Build(context.Background(), second, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, c := range Components {
		a, errA := os.ReadFile(filepath.Join(first, c.Archive()))
		b, errB := os.ReadFile(filepath.Join(second, c.Archive()))
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two builds", c.Archive())
		}
	}
}
