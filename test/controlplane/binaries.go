package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/lifeboat-vm/lifeboat/test/internal/cache"
)

// Versions of the control plane the harness builds. They are pinned in test/tools.
const (
	KubernetesVersion = "v1.37.1"
	EtcdVersion       = "v3.7.3"
	ContainerdVersion = "v2.2.9"
)

// Binaries are the paths of the built control plane commands.
type Binaries struct {
	Etcd              string
	APIServer         string
	ControllerManager string
	Scheduler         string
	Kubectl           string
}

// Dir is the directory that holds the Kubernetes binaries (kubectl among them).
func (b Binaries) Dir() string { return filepath.Dir(b.APIServer) }

// RepoRoot finds the lifeboat checkout by walking up from the working directory,
// so tests in any package and commands run from anywhere in the tree agree on it.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test", "tools", "k8s", "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside a lifeboat checkout: no test/tools/k8s/go.mod above the working directory")
		}
		dir = parent
	}
}

type build struct {
	out     string // path of the binary in the cache
	module  string // tools module directory, relative to the repository root
	pkg     string
	ldflags string
	tags    string
	noCgo   bool
}

// EnsureBinaries returns the control plane binaries, building the missing ones from the
// pinned Go modules first. Builds are serialised across processes with a lock in the cache,
// so parallel test packages build each binary once.
func EnsureBinaries(ctx context.Context, progress io.Writer) (Binaries, error) {
	k8sDir, etcdDir, err := binaryDirs()
	if err != nil {
		return Binaries{}, err
	}
	bins := Binaries{
		Etcd:              filepath.Join(etcdDir, "etcd"),
		APIServer:         filepath.Join(k8sDir, "kube-apiserver"),
		ControllerManager: filepath.Join(k8sDir, "kube-controller-manager"),
		Scheduler:         filepath.Join(k8sDir, "kube-scheduler"),
		Kubectl:           filepath.Join(k8sDir, "kubectl"),
	}
	err = ensure(ctx, progress, []build{
		{out: bins.Etcd, module: "test/tools/etcd", pkg: "go.etcd.io/etcd/server/v3"},
		kubernetesBuild(bins.APIServer, "kube-apiserver"),
		kubernetesBuild(bins.ControllerManager, "kube-controller-manager"),
		kubernetesBuild(bins.Scheduler, "kube-scheduler"),
		kubernetesBuild(bins.Kubectl, "kubectl"),
	})
	return bins, err
}

// EnsureKubelet returns the path of a kubelet of the control plane's version, built like the
// other binaries. It is apart from EnsureBinaries because only tests with a real node need it.
func EnsureKubelet(ctx context.Context, progress io.Writer) (string, error) {
	k8sDir, _, err := binaryDirs()
	if err != nil {
		return "", err
	}
	kubelet := filepath.Join(k8sDir, "kubelet")
	return kubelet, ensure(ctx, progress, []build{kubernetesBuild(kubelet, "kubelet")})
}

// EnsureKubeProxy returns the path of a kube-proxy of the control plane's version, built like
// the other binaries, for tests that route Services on the emulated nodes' pod network.
func EnsureKubeProxy(ctx context.Context, progress io.Writer) (string, error) {
	k8sDir, _, err := binaryDirs()
	if err != nil {
		return "", err
	}
	proxy := filepath.Join(k8sDir, "kube-proxy")
	return proxy, ensure(ctx, progress, []build{kubernetesBuild(proxy, "kube-proxy")})
}

// EnsureContainerd returns the directory holding containerd, its runc shim
// (containerd-shim-runc-v2, which containerd finds beside itself) and ctr, of ContainerdVersion,
// built from test/tools/containerd: the real node's runtime, which mounts image volumes.
func EnsureContainerd(ctx context.Context, progress io.Writer) (string, error) {
	cacheDir, err := cache.Dir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "containerd-"+ContainerdVersion)
	var builds []build
	for _, command := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		builds = append(builds, build{
			out: filepath.Join(dir, command), module: "test/tools/containerd", pkg: "github.com/containerd/containerd/v2/cmd/" + command,
			ldflags: "-X github.com/containerd/containerd/v2/version.Version=" + ContainerdVersion,
			// Pure Go: the snapshotters that need C libraries (btrfs, devmapper, zfs) are not used.
			tags: "no_btrfs no_devmapper no_zfs", noCgo: true,
		})
	}
	return dir, ensure(ctx, progress, builds)
}

func binaryDirs() (k8sDir, etcdDir string, err error) {
	cacheDir, err := cache.Dir()
	if err != nil {
		return "", "", err
	}
	return filepath.Join(cacheDir, "k8s-"+KubernetesVersion), filepath.Join(cacheDir, "etcd-"+EtcdVersion), nil
}

// kubernetesBuild builds k8s.io/kubernetes/cmd/<command>, stamped with the version it is.
func kubernetesBuild(out, command string) build {
	version := "-X k8s.io/component-base/version.gitVersion=" + KubernetesVersion +
		" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37" +
		" -X k8s.io/client-go/pkg/version.gitVersion=" + KubernetesVersion
	return build{out: out, module: "test/tools/k8s", pkg: "k8s.io/kubernetes/cmd/" + command, ldflags: version}
}

// ensure builds the missing ones of builds, under the cache's build lock.
func ensure(ctx context.Context, progress io.Writer, builds []build) error {
	if allExist(builds) {
		return nil
	}
	if progress == nil {
		progress = io.Discard
	}
	cacheDir, err := cache.Dir()
	if err != nil {
		return err
	}
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	unlock, err := cache.Lock(filepath.Join(cacheDir, ".build.lock"))
	if err != nil {
		return err
	}
	defer unlock()

	for _, b := range builds {
		if _, err := os.Stat(b.out); err == nil {
			continue // built while we waited for the lock, or earlier
		}
		if err := goBuild(ctx, root, b, progress); err != nil {
			return err
		}
	}
	return nil
}

func allExist(builds []build) bool {
	for _, b := range builds {
		if _, err := os.Stat(b.out); err != nil {
			return false
		}
	}
	return true
}

func goBuild(ctx context.Context, root string, b build, progress io.Writer) error {
	if err := os.MkdirAll(filepath.Dir(b.out), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(progress, "building %s (once; cached in %s)\n", b.pkg, filepath.Dir(b.out))
	tmp := b.out + ".partial"
	g := GoBuild{Dir: filepath.Join(root, b.module), Out: tmp, Packages: []string{b.pkg},
		Release: true, LDFlags: b.ldflags, Tags: b.tags, Output: progress}
	if b.noCgo {
		g.Env = []string{"CGO_ENABLED=0"}
	}
	if err := g.Run(ctx); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, b.out)
}
