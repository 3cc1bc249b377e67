package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/images"
)

// PauseImage is the sandbox image the node's containerd runs every pod's sandbox from.
const PauseImage = "lifeboat.dev/pause:dev"

// GoImage is an image made of one static Go command from the lifeboat module, at /<base name>.
type GoImage struct {
	// Name is the image's reference, e.g. lifeboat.dev/pause:dev.
	Name string
	// Package is the main package to build, e.g. ./test/cmd/lifeboat-pause.
	Package string
}

// PauseGoImage is the pause image, built from test/cmd/lifeboat-pause.
var PauseGoImage = GoImage{Name: PauseImage, Package: "./test/cmd/lifeboat-pause"}

// Build compiles the command (static, CGO off) in the checkout at root and writes the image
// to out as an OCI layout archive that containerd imports under the image's name.
func (g GoImage) Build(ctx context.Context, root, out string) error {
	bin, err := os.MkdirTemp("", "lifeboat-image-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	path := filepath.Join(bin, filepath.Base(g.Package))
	build := controlplane.GoBuild{Dir: root, Out: path, Packages: []string{g.Package}, Release: true, Env: []string{"CGO_ENABLED=0"}}
	if err := build.Run(ctx); err != nil {
		return fmt.Errorf("the image %s: %w", g.Name, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	entry := "/" + filepath.Base(g.Package)
	layer, err := images.FileLayer(map[string][]byte{entry: data}, 0o755)
	if err != nil {
		return err
	}
	img, err := mutate.ConfigFile(images.OCIBase(), &v1.ConfigFile{
		Architecture: "amd64", OS: "linux", Config: v1.Config{Entrypoint: []string{entry}},
	})
	if err != nil {
		return err
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return err
	}
	return images.WriteArchive(out, img, g.Name)
}
