package node

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	securejoin "github.com/cyphar/filepath-securejoin"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// ImageNameAnnotation names an image in an image store's index, as containerd names imported images.
const ImageNameAnnotation = "io.containerd.image.name"

// imageStore is what a node can "pull": the images of an OCI image layout, each named by the
// ImageNameAnnotation of its index entry. A pulled image is unpacked once under unpackDir, by
// digest, and image volumes bind-mount it read-only, as a runtime mounts an image volume.
type imageStore struct {
	layout    string
	unpackDir string

	mu       sync.Mutex
	unpacked map[string]string // reference → root
}

// errImageNotFound is a reference the store does not hold.
var errImageNotFound = errors.New("not in the node's image store")

// root is where the image named ref is unpacked, unpacking it first if it is not yet.
func (s *imageStore) root(ref string) (string, error) {
	if s == nil {
		return "", fmt.Errorf("image %q: %w (it has none)", ref, errImageNotFound)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if dir, ok := s.unpacked[ref]; ok {
		return dir, nil
	}
	if s.layout == "" {
		return "", fmt.Errorf("image %q: %w (it has none)", ref, errImageNotFound)
	}
	img, digest, err := findImage(s.layout, ref)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(s.unpackDir, digest.Algorithm, digest.Hex)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := unpack(img, dir); err != nil {
			return "", fmt.Errorf("unpacking image %q: %w", ref, err)
		}
	}
	if s.unpacked == nil {
		s.unpacked = map[string]string{}
	}
	s.unpacked[ref] = dir
	return dir, nil
}

// known is the root of an image already unpacked, or "".
func (s *imageStore) known(ref string) string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unpacked[ref]
}

func findImage(path, ref string) (v1.Image, v1.Hash, error) {
	lp, err := ocilayout.FromPath(path)
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("the node's image store: %w", err)
	}
	index, err := lp.ImageIndex()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	for _, d := range manifest.Manifests {
		if d.Annotations[ImageNameAnnotation] == ref {
			img, err := index.Image(d.Digest)
			return img, d.Digest, err
		}
	}
	return nil, v1.Hash{}, fmt.Errorf("image %q: %w", ref, errImageNotFound)
}

// unpack writes img's file system to dir, which appears whole or not at all. Every name is
// resolved inside dir, so a layer cannot write outside it.
func unpack(img v1.Image, dir string) error {
	tmp := dir + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		target, err := securejoin.SecureJoin(tmp, h.Name)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, mode|0o100)
		case tar.TypeReg:
			err = writeFile(target, tr, mode)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, target)
		case tar.TypeLink:
			var old string
			if old, err = securejoin.SecureJoin(tmp, h.Linkname); err == nil {
				err = os.Link(old, target)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", strings.TrimPrefix(h.Name, "./"), err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
