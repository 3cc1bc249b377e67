package launcher

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// CheckNodePaths refuses a boot file that is not in one of the allowed node directories the pod
// mounts, or that resolves, through symlinks, out of its directory: only the node can see where
// a symlink leads, so admission cannot refuse it.
func CheckNodePaths(boot v1alpha1.BootSource, allowed []string) error {
	for _, f := range v1alpha1.NodePaths(boot) {
		dir, ok := v1alpha1.AllowedDirectory(f.Path, allowed)
		if !ok {
			return fmt.Errorf("%s %q is not in a node directory this pod mounts (%s): refused", f.Field, f.Path, strings.Join(allowed, ", "))
		}
		realDir, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return fmt.Errorf("the allowed node directory of %s: %w", f.Field, err)
		}
		real, err := filepath.EvalSymlinks(f.Path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Field, err)
		}
		if !strings.HasPrefix(real, realDir+string(filepath.Separator)) {
			return fmt.Errorf("%s %q resolves to %q, out of the allowed node directory %s: refused", f.Field, f.Path, real, dir)
		}
	}
	return nil
}
