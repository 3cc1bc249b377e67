package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestCheckNodePaths(t *testing.T) {
	root := t.TempDir()
	allowed := filepath.Join(root, "guest")
	outside := filepath.Join(root, "secret")
	for _, d := range []string{allowed, outside, filepath.Join(allowed, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(allowed, "vmlinuz"), filepath.Join(outside, "shadow")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"out":      filepath.Join(outside, "shadow"), // a symlink out of the allowed directory
		"in":       "vmlinuz",                        // a symlink that stays inside
		"sub/up":   "../../secret/shadow",            // a relative one that climbs out
		"etc":      "/etc",                           // a directory out, used as a path prefix
		"sub/loop": "../in",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(allowed, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		boot   v1alpha1.BootSource
		refuse string
	}{
		{"a file in the directory", v1alpha1.BootSource{Kernel: filepath.Join(allowed, "vmlinuz")}, ""},
		{"a symlink that stays inside", v1alpha1.BootSource{Kernel: filepath.Join(allowed, "sub/loop")}, ""},
		{"a symlink out", v1alpha1.BootSource{Kernel: filepath.Join(allowed, "out")}, "out of the allowed node directory"},
		{"a relative symlink that climbs out", v1alpha1.BootSource{Initrd: filepath.Join(allowed, "sub/up"), Kernel: filepath.Join(allowed, "vmlinuz")}, "boot.initrd"},
		{"a file under a symlinked directory out", v1alpha1.BootSource{Disk: filepath.Join(allowed, "etc/hostname")}, "boot.disk"},
		{"a file outside the mounted directories", v1alpha1.BootSource{Kernel: filepath.Join(outside, "shadow")}, "not in a node directory this pod mounts"},
		{"a missing file", v1alpha1.BootSource{Kernel: filepath.Join(allowed, "nothing")}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckNodePaths(tc.boot, []string{allowed})
			switch {
			case tc.refuse == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Errorf("got %v, want a refusal containing %q", err, tc.refuse)
			}
		})
	}
}
