package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PauseImage is the sandbox image the node's containerd runs every pod's sandbox from.
const PauseImage = "lifeboat.dev/pause:dev"

// GoImage is an image made of static Go commands from the lifeboat module, each at /<base name>.
type GoImage struct {
	// Name is the image's reference, e.g. lifeboat.dev/pause:dev.
	Name string
	// Packages are the main packages to build, e.g. ./test/cmd/lifeboat-pause.
	Packages []string
	// Entrypoint is the image's entrypoint; empty means the first command.
	Entrypoint []string
}

// PauseGoImage is the pause image, built from test/cmd/lifeboat-pause.
var PauseGoImage = GoImage{Name: PauseImage, Packages: []string{"./test/cmd/lifeboat-pause"}}

// Build compiles the image's commands (static, CGO off) in the checkout at root and writes
// the image to out as an OCI layout archive, named for containerd's import by the
// io.containerd.image.name annotation.
func (g GoImage) Build(ctx context.Context, root, out string) error {
	bin, err := os.MkdirTemp("", "lifeboat-image-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", bin + "/"}, g.Packages...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %v for %s: %w\n%s", g.Packages, g.Name, err, b)
	}
	layer, err := layerOf(bin)
	if err != nil {
		return err
	}
	entry := g.Entrypoint
	if len(entry) == 0 {
		entry = []string{"/" + filepath.Base(g.Packages[0])}
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Entrypoint = entry
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	return writeOCIArchive(img, g.Name, out)
}

// layerOf is one layer holding every file of dir at the root, executable.
func layerOf(dir string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.Name(), Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// writeOCIArchive writes img as a tar of an OCI image layout whose index names it.
func writeOCIArchive(img v1.Image, name, out string) error {
	dir, err := os.MkdirTemp("", "lifeboat-oci-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name,
	})); err != nil {
		return fmt.Errorf("writing the layout of %s: %w", name, err)
	}
	return tarDir(dir, out)
}

func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil || d.IsDir() {
			return err
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
