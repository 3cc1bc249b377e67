package node

import (
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// layout says where a node keeps things on this machine. Its paths follow the kubelet's own
// (/var/lib/kubelet/pods, /var/log/pods) under the node's root, so that a hostPath volume of
// /var/lib/kubelet sees them as a pod on a real node would.
type layout struct {
	root    string
	private []string
	images  *imageStore
	api     *apiVolumes
}

// newLayout is the layout of the node cfg describes, with its image store and the volumes it
// reads from the API server.
func newLayout(cfg Config) layout {
	l := layout{root: cfg.RootDir, private: cfg.PrivateHostPaths, images: &imageStore{
		layout: cfg.Images, unpackDir: filepath.Join(cfg.RootDir, "var/lib/lifeboat-node/images"),
	}}
	l.api = &apiVolumes{client: cfg.Client, l: &layout{root: l.root, private: l.private}}
	return l
}

// hostPath is where a host path of the node lives on this machine: under the root for the
// node's private prefixes, the machine's own path otherwise. /var/run is /run, as on every
// current Linux, so both spellings of a private path meet in one place.
func (l layout) hostPath(path string) string {
	path = canonicalRun(filepath.Clean(path))
	for _, prefix := range l.private {
		prefix = canonicalRun(filepath.Clean(prefix))
		if path == prefix || strings.HasPrefix(path, prefix+"/") {
			return filepath.Join(l.root, path)
		}
	}
	return path
}

func canonicalRun(path string) string {
	if path == "/var/run" || strings.HasPrefix(path, "/var/run/") {
		return strings.TrimPrefix(path, "/var")
	}
	return path
}

func (l layout) podDir(uid types.UID) string {
	return filepath.Join(l.root, "var/lib/kubelet/pods", string(uid))
}

func (l layout) emptyDir(uid types.UID, volume string) string {
	return filepath.Join(l.podDir(uid), "volumes/kubernetes.io~empty-dir", volume)
}

// logDir holds a container's logs, one file per run: <restartCount>.log.
func (l layout) logDir(namespace, name string, uid types.UID, container string) string {
	return filepath.Join(l.root, "var/log/pods", fmt.Sprintf("%s_%s_%s", namespace, name, uid), container)
}

func (l layout) logPath(namespace, name string, uid types.UID, container string, restartCount int32) string {
	return filepath.Join(l.logDir(namespace, name, uid, container), fmt.Sprintf("%d.log", restartCount))
}

func (l layout) secretDir(uid types.UID, volume string) string {
	return filepath.Join(l.podDir(uid), "volumes/kubernetes.io~secret", volume)
}
