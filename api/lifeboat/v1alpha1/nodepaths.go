package v1alpha1

import (
	"fmt"
	"path"
	"strings"
)

// NodePath is a node file a VMI's spec names, with the field that names it.
// +k8s:deepcopy-gen=false
type NodePath struct {
	Field string // boot.kernel, boot.initrd or boot.disk
	Path  string
}

// NodePaths are the node files a VMI's spec.boot names.
func NodePaths(boot BootSource) []NodePath {
	var paths []NodePath
	for _, p := range []NodePath{{"boot.kernel", boot.Kernel}, {"boot.initrd", boot.Initrd}, {"boot.disk", boot.Disk}} {
		if p.Path != "" {
			paths = append(paths, p)
		}
	}
	return paths
}

// AllowedDirectory returns the innermost directory of allowed that holds p, or false if none does
// or p is not a clean absolute path. Symlinks are the node's to resolve; see the launcher.
func AllowedDirectory(p string, allowed []string) (string, bool) {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return "", false
	}
	found := ""
	for _, d := range allowed {
		if d != "/" && strings.HasPrefix(p, d+"/") && len(d) > len(found) {
			found = d
		}
	}
	return found, found != ""
}

// RefusedNodePath says why boot may not be used under the allow-list, or "" if it may: every
// node path it names must be clean, absolute and inside one of the allowed directories.
// The admission policy (manifests/vmi-node-paths.yaml) says the same in CEL.
func RefusedNodePath(boot BootSource, allowed []string) string {
	for _, f := range NodePaths(boot) {
		if _, ok := AllowedDirectory(f.Path, allowed); ok {
			continue
		}
		if len(allowed) == 0 {
			return fmt.Sprintf("%s %q is a node path, and the cluster admin allows none (LifeboatConfig %q spec.allowedNodeDirectories is empty)", f.Field, f.Path, ConfigName)
		}
		return fmt.Sprintf("%s %q is not a clean path inside a node directory the cluster admin allows (LifeboatConfig %q spec.allowedNodeDirectories: %s)",
			f.Field, f.Path, ConfigName, strings.Join(allowed, ", "))
	}
	return ""
}
