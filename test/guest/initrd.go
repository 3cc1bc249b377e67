package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/cavaliergopher/cpio"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// initPackage is the guest's /init, built from this module.
const initPackage = "github.com/lifeboat-vm/lifeboat/test/guest/init"

// ensureInitrd builds /init and returns the cached initrd made from it and k's modules.
// The initrd is named after the hash of its contents, so any change to init's sources,
// its dependencies or the image layout gives a new one, and an unchanged one is reused.
func ensureInitrd(ctx context.Context, cache string, k kernel, progress io.Writer) (string, error) {
	init, err := buildInit(ctx)
	if err != nil {
		return "", err
	}
	names, err := k.modules()
	if err != nil {
		return "", err
	}
	var modules []module
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(k.modulesDir(), name+".ko"))
		if err != nil {
			return "", fmt.Errorf("reading the guest's kernel module %s: %w", name, err)
		}
		modules = append(modules, module{name: name, data: data})
	}
	archive, err := initrdArchive(init, modules)
	if err != nil {
		return "", fmt.Errorf("writing the guest initrd: %w", err)
	}
	sum := sha256.Sum256(archive)
	initrd := filepath.Join(cache, fmt.Sprintf("initrd-%x.cpio.gz", sum[:8]))
	if exists(initrd) {
		return initrd, nil
	}
	unlock, err := lockCache(cache)
	if err != nil {
		return "", err
	}
	defer unlock()
	if exists(initrd) {
		return initrd, nil
	}
	fmt.Fprintf(progress, "writing the test guest initrd %s\n", initrd)
	if err := writeGzipAtomically(initrd, archive); err != nil {
		return "", fmt.Errorf("writing the guest initrd: %w", err)
	}
	return initrd, nil
}

// buildInit builds the static /init binary and returns it. With -trimpath and no VCS
// stamp the build is reproducible, so the binary's bytes identify its sources.
func buildInit(ctx context.Context) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "lifeboat-guest-init-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "init")
	build := controlplane.GoBuild{Out: out, Packages: []string{initPackage}, Release: true, Env: []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}}
	if err := build.Run(ctx); err != nil {
		return nil, fmt.Errorf("the guest's /init: %w", err)
	}
	return os.ReadFile(out)
}

// module is a kernel module to put in the initrd.
type module struct {
	name string
	data []byte
}

// initrdArchive lays out the guest's root file system as an uncompressed newc cpio archive.
// It has no device nodes (the writer cannot make them): the kernel's built-in initramfs
// already holds /dev/console, which init's standard streams come from, and init mounts
// devtmpfs for the rest. Timestamps are zero, so equal contents give equal archives.
func initrdArchive(init []byte, modules []module) ([]byte, error) {
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	made := map[string]bool{".": true}
	// dir writes name and its missing parents: the kernel's unpacker creates no parents.
	var dir func(name string) error
	dir = func(name string) error {
		if made[name] {
			return nil
		}
		if err := dir(path.Dir(name)); err != nil {
			return err
		}
		made[name] = true
		return w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeDir | 0o755, Links: 2})
	}
	file := func(name string, mode cpio.FileMode, data []byte) error {
		if err := dir(path.Dir(name)); err != nil {
			return err
		}
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | mode, Size: int64(len(data)), Links: 1}); err != nil {
			return err
		}
		_, err := w.Write(data)
		return err
	}
	// Mount points for init.
	for _, d := range []string{"dev", "proc", "sys"} {
		if err := dir(d); err != nil {
			return nil, err
		}
	}
	if err := file("init", 0o755, init); err != nil {
		return nil, err
	}
	var list strings.Builder
	for _, m := range modules {
		name := path.Join("lib/modules", m.name+".ko")
		if err := file(name, 0o644, m.data); err != nil {
			return nil, err
		}
		fmt.Fprintf(&list, "/%s\n", name)
	}
	if err := file(strings.TrimPrefix(protocol.ModulesFile, "/"), 0o644, []byte(list.String())); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeGzipAtomically writes data gzip'd to a temporary file beside path and renames it
// into place, so readers see the whole file or none.
func writeGzipAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".partial-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	zw := gzip.NewWriter(tmp)
	if _, err := zw.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
