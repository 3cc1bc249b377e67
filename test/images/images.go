// Package images builds lifeboat's container images here, without a registry or a container
// engine: each is an OCI image layout in a tarball (<name>.oci.tar) that
// `ctr -n k8s.io images import` loads into a node's containerd under its name.
//
//   - lifeboat.dev/lifeboat-controller:dev: the static controller binary alone;
//   - lifeboat.dev/lifeboat-agent:dev and lifeboat.dev/lifeboat-launcher:dev: a Debian 12 userland
//     with libvirt and QEMU (DebianRootfs), one layer that both share, and the binary on top.
//     The agent needs only libvirt's client library from it, but a shared layer is stored and
//     pulled once per node, where a separate smaller one would be extra.
package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

const (
	// Registry and Tag make the images' names, as the manifests use them.
	Registry = "lifeboat.dev/"
	Tag      = "dev"
	// binDir holds the binary in each image; it is on the images' PATH, as the launcher pod's
	// command (api/launcher.Command) expects.
	binDir = "/usr/local/bin"
	// AnnotationImageName is containerd's annotation for an image's full name in an index.
	AnnotationImageName = "io.containerd.image.name"
)

// epoch is every image's timestamp, so that the same inputs give the same image digests.
var epoch = time.Unix(0, 0).UTC()

// Component is one of lifeboat's images.
type Component struct {
	// Name is the binary (cmd/<Name>) and the image's name under Registry.
	Name string
	// Debian puts the binary on the Debian userland; otherwise it is alone, and built static.
	Debian bool
	// User is the user the image runs as by default (its pod may say otherwise).
	User string
}

// Components are lifeboat's images.
var Components = []Component{
	{Name: "lifeboat-agent", Debian: true, User: "0"},
	{Name: "lifeboat-controller", User: "65532:65532"},
	// The launcher never runs as root; its pods say so too (runAsUser).
	{Name: "lifeboat-launcher", Debian: true, User: fmt.Sprintf("%d:%d", launcher.UID, launcher.GID)},
}

// Ref is the image's full name.
func (c Component) Ref() string { return Registry + c.Name + ":" + Tag }

// Archive is the file name Build gives the image in its output directory.
func (c Component) Archive() string { return c.Name + ".oci.tar" }

// Build builds lifeboat's binaries and images, writing out/<name>.oci.tar for each component.
func Build(ctx context.Context, out string, progress io.Writer) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return build(ctx, progress, func(c Component, img v1.Image) error {
		path := filepath.Join(out, c.Archive())
		if err := WriteArchive(path, img, c.Ref()); err != nil {
			return err
		}
		fmt.Fprintf(progress, "%s → %s\n", c.Ref(), path)
		return nil
	})
}

// Push builds lifeboat's images and pushes each to registry (a host[:port][/path] prefix) as
// <registry>/<name>:<tag>, with the credentials docker login or a container engine's login
// stored (the default keychain). A registry on loopback is spoken to in plain HTTP. It returns
// the references pushed, by component name.
func Push(ctx context.Context, registry, tag string, progress io.Writer) (map[string]string, error) {
	pushed := map[string]string{}
	err := build(ctx, progress, func(c Component, img v1.Image) error {
		ref, err := name.NewTag(strings.TrimSuffix(registry, "/") + "/" + c.Name + ":" + tag)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing %s: %w", ref, err)
		}
		pushed[c.Name] = ref.String()
		fmt.Fprintf(progress, "%s → %s\n", c.Ref(), ref)
		return nil
	})
	return pushed, err
}

// build builds each component's binary and image and hands the image to done.
func build(ctx context.Context, progress io.Writer, done func(Component, v1.Image) error) error {
	bins, err := os.MkdirTemp("", "lifeboat-images-bin-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bins)
	rootfs, err := DebianRootfs(ctx, progress)
	if err != nil {
		return err
	}
	// One layer object for both images, so it is compressed and hashed once.
	debian, err := tarball.LayerFromFile(rootfs, tarball.WithMediaType(types.OCILayer),
		tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
	if err != nil {
		return fmt.Errorf("reading %s: %w", rootfs, err)
	}
	for _, c := range Components {
		binary := filepath.Join(bins, c.Name)
		if err := goBuild(ctx, c, binary, progress); err != nil {
			return err
		}
		var base []v1.Layer
		if c.Debian {
			base = []v1.Layer{debian}
		}
		img, err := image(c, binary, base)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		if err := done(c, img); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	return nil
}

func goBuild(ctx context.Context, c Component, binary string, progress io.Writer) error {
	// The agent and the launcher link libvirt (cgo) and find it in the Debian layer; the
	// controller needs no C and runs on an empty image.
	cgo := "1"
	if !c.Debian {
		cgo = "0"
	}
	return controlplane.GoBuild{Out: binary, Packages: []string{"./cmd/" + c.Name}, Env: []string{"CGO_ENABLED=" + cgo}, Output: progress}.Run(ctx)
}

// image is base, then a layer with the binary in binDir, which is the entrypoint.
func image(c Component, binary string, base []v1.Layer) (v1.Image, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	binLayer, err := FileLayer(map[string][]byte{binDir + "/" + c.Name: data}, 0o755)
	if err != nil {
		return nil, err
	}
	return NewImage(v1.Config{
		Entrypoint: []string{binDir + "/" + c.Name},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		User:       c.User,
		Labels:     map[string]string{"org.opencontainers.image.title": c.Name, "org.opencontainers.image.source": "https://github.com/lifeboat-vm/lifeboat"},
	}, append(base, binLayer)...)
}

// NewImage is a linux/amd64 OCI image of layers, bottom first, that runs as cfg says, stamped
// with epoch (for other images built the same way, such as a node's pause image).
func NewImage(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.ConfigFile(OCIBase(), &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		// AppendLayers fills in the layers' diff IDs; the type is the only one the spec has.
		RootFS: v1.RootFS{Type: "layers"},
		Config: cfg,
	})
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(img, layers...)
}

// OCIBase is an empty image with OCI media types (go-containerregistry's empty image is Docker's).
func OCIBase() v1.Image {
	return mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
}

// FileLayer is an OCI layer holding files (path → content) with mode, owned by root, with
// their parent directories, all stamped with epoch.
func FileLayer(files map[string][]byte, mode int64) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, path := range sortedKeys(files) {
		for _, d := range parents(path) {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		data := files[path]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path[1:], Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestSpeed))
}

// parents are the directories above an absolute path, outermost first, without the leading slash.
func parents(path string) []string {
	var out []string
	for d := filepath.Dir(path); d != "/"; d = filepath.Dir(d) {
		out = append([]string{d[1:]}, out...)
	}
	return out
}
