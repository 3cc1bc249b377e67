package node

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// layerOf is a layer of tar entries; a regular file's content is its Linkname field's text.
func layerOf(t *testing.T, entries ...tar.Header) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		data := []byte(h.Linkname)
		if h.Typeflag == tar.TypeReg {
			h.Linkname, h.Size = "", int64(len(data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return layer
}

func TestImageVolumesComeFromTheStoreAndStayInside(t *testing.T) {
	store := t.TempDir()
	lp, err := ocilayout.Write(store, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image,
		layerOf(t,
			tar.Header{Typeflag: tar.TypeDir, Name: "boot/", Mode: 0o755},
			tar.Header{Typeflag: tar.TypeReg, Name: "boot/vmlinuz-6.1", Mode: 0o644, Linkname: "kernel"},
			tar.Header{Typeflag: tar.TypeSymlink, Name: "boot/vmlinuz", Linkname: "vmlinuz-6.1"},
			// A layer naming a path out of the image never lands out of it.
			tar.Header{Typeflag: tar.TypeReg, Name: "../../escaped", Mode: 0o644, Linkname: "stays in"},
		),
		// An upper layer deletes a file of a lower one (a whiteout), as image builders write it.
		layerOf(t, tar.Header{Typeflag: tar.TypeReg, Name: "boot/.wh.vmlinuz-6.1", Mode: 0o644}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, ocilayout.WithAnnotations(map[string]string{ImageNameAnnotation: "example.org/guest:1"})); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	s := &imageStore{layout: store, unpackDir: filepath.Join(root, "images")}

	if got := s.known("example.org/guest:1"); got != "" {
		t.Errorf("known before a pull = %q, want nothing", got)
	}
	dir, err := s.root("example.org/guest:1")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.known("example.org/guest:1"); got != dir {
		t.Errorf("known after the pull = %q, want %q", got, dir)
	}
	// go-containerregistry's flattening may drop it; if anything writes it, it is inside.
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "escaped" && p != filepath.Join(dir, "escaped") {
			t.Errorf("the entry naming ../../escaped was written out of the image, at %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "boot/vmlinuz-6.1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file the upper layer deleted: %v, want it gone", err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "boot/vmlinuz")); err != nil || target != "vmlinuz-6.1" {
		t.Errorf("the symlink: %q, %v; want it kept as written", target, err)
	}

	if _, err := s.root("example.org/other:1"); !errors.Is(err, errImageNotFound) {
		t.Errorf("an image the store lacks: %v, want errImageNotFound", err)
	}
	if _, err := (*imageStore)(nil).root("example.org/guest:1"); !errors.Is(err, errImageNotFound) {
		t.Errorf("a node without a store: %v, want errImageNotFound", err)
	}
}
