package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cavaliergopher/cpio"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// ensure builds (or finds) the image once for this test binary.
var ensure = sync.OnceValues(func() (Image, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	return Ensure(ctx, os.Stderr)
})

func TestEnsureBuildsABootableImage(t *testing.T) {
	img, err := ensure()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{img.Kernel, img.Initrd} {
		if !filepath.IsAbs(p) {
			t.Errorf("image path %q is not absolute", p)
		}
		if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
			t.Errorf("image file %q: %v (size %d)", p, err, sizeOf(fi))
		}
	}
	files := readInitrd(t, img.Initrd)
	for name := range files {
		// The kernel's unpacker creates no parent directories.
		if parent := path.Dir(name); parent != "." && !files[parent].mode.IsDir() {
			t.Errorf("the initrd has %s but not its directory %s", name, parent)
		}
	}
	init, ok := files["init"]
	if !ok {
		t.Fatalf("the initrd has no /init; it has %v", keys(files))
	}
	if init.mode&0o111 == 0 {
		t.Errorf("/init is not executable: mode %o", init.mode)
	}
	exe, err := elf.NewFile(bytes.NewReader(init.data))
	if err != nil {
		t.Fatalf("/init is not an ELF binary: %v", err)
	}
	if exe.Machine != elf.EM_X86_64 {
		t.Errorf("/init is built for %v, want x86-64", exe.Machine)
	}
	for _, p := range exe.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/init is dynamically linked; the guest has no libc, so it must be static")
		}
	}
	list, ok := files[protocol.ModulesFile[1:]]
	if !ok {
		t.Fatalf("the initrd has no %s", protocol.ModulesFile)
	}
	// Every module init needs is listed (after its dependencies: loadOrder's test), and every
	// listed module is in the initrd.
	listed := strings.Fields(string(list.data))
	for _, name := range guestModules {
		if !slices.Contains(listed, "/lib/modules/"+name+".ko") {
			t.Errorf("%s = %q lacks %s", protocol.ModulesFile, list.data, name)
		}
	}
	for _, m := range listed {
		if _, ok := files[m[1:]]; !ok {
			t.Errorf("the initrd has no %s", m)
		}
	}
}

func TestEnsureReusesTheCacheAcrossConcurrentCallers(t *testing.T) {
	first, err := ensure()
	if err != nil {
		t.Fatal(err)
	}
	// A cache that has the kernel but no initrd yet, so the callers race to build it.
	cache := t.TempDir()
	t.Setenv("LIFEBOAT_CACHE", cache)
	kernelDir := filepath.Dir(first.Kernel)
	if err := os.CopyFS(filepath.Join(cache, "guest", filepath.Base(kernelDir)), os.DirFS(kernelDir)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const callers = 3
	images := make([]Image, callers)
	errs := make([]error, callers)
	var progress lockedBuffer
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { images[i], errs[i] = Ensure(ctx, &progress) })
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if images[i] != images[0] {
			t.Errorf("caller %d got %+v, caller 0 %+v", i, images[i], images[0])
		}
	}
	if n := strings.Count(progress.String(), "writing the test guest initrd"); n != 1 {
		t.Errorf("the initrd was written %d times, want once; progress:\n%s", n, progress.String())
	}
	entries, err := os.ReadDir(filepath.Join(cache, "guest"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), "partial") {
			t.Errorf("a partial file was left in the cache: %s", e.Name())
		}
	}
	if filepath.Base(images[0].Initrd) != filepath.Base(first.Initrd) {
		t.Errorf("the same init and kernel gave initrd %s, and %s in the other cache: the name must follow the contents",
			filepath.Base(images[0].Initrd), filepath.Base(first.Initrd))
	}

	again, err := Ensure(ctx, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if again != images[0] || strings.Count(progress.String(), "writing") != 1 {
		t.Errorf("a second Ensure rebuilt: got %+v, progress:\n%s", again, progress.String())
	}
}

// lockedBuffer is a progress writer shared by goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type cpioFile struct {
	mode cpio.FileMode
	data []byte
}

func readInitrd(t *testing.T, path string) map[string]cpioFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the initrd is not gzip'd: %v", err)
	}
	r := cpio.NewReader(zr)
	files := map[string]cpioFile{}
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("reading the initrd as cpio: %v", err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = cpioFile{mode: h.Mode, data: data}
	}
}

func keys(m map[string]cpioFile) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return 0
	}
	return fi.Size()
}
