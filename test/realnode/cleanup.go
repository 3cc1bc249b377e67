package realnode

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/test/internal/cache"
)

// dirPrefix names the nodes' directories in the temporary directory.
const dirPrefix = "lbr"

// cgroupPrefix names the nodes' own cgroup roots (Config.OwnCgroupRoot) in every hierarchy.
const cgroupPrefix = "lifeboat-node-"

// machine counts this test binary's running real nodes, which hold the machine-wide lock.
var machine struct {
	sync.Mutex
	nodes  int
	unlock func()
}

// lockMachine takes the machine for this test binary's real nodes: the first node of the binary
// waits for the lock, which only a live test binary with real nodes holds, and sweeps what a
// killed one left; the others share it. The function it returns releases the node's share.
func lockMachine() (func(), error) {
	machine.Lock()
	defer machine.Unlock()
	if machine.nodes == 0 {
		unlock, err := cache.Lock(filepath.Join(os.TempDir(), "lifeboat-realnode.lock"))
		if err != nil {
			return nil, err
		}
		machine.unlock = unlock
		sweepStale()
	}
	machine.nodes++
	return func() {
		machine.Lock()
		defer machine.Unlock()
		if machine.nodes--; machine.nodes == 0 {
			machine.unlock()
		}
	}, nil
}

// sweepStale removes what real nodes whose test binary was killed left: their containers'
// processes and cgroups, their shims, their mounts and their directories. The caller holds the
// lock that only a live test binary with real nodes holds, so whatever is found is stale.
func sweepStale() {
	parents := []string{""}
	roots, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", cgroupPrefix+"*"))
	for _, r := range roots {
		if p := "/" + filepath.Base(r); !slices.Contains(parents, p) {
			parents = append(parents, p)
		}
	}
	for _, p := range parents {
		killPodProcesses(p)
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "containerd.toml")); err == nil {
			removeNodeDir(d)
		}
	}
	for _, p := range parents {
		removePodCgroups(cgroupRoot, p)
	}
}

// makeCgroupRoot creates a kubelet's cgroupRoot parent (empty: the machine's root, which is
// there) in every hierarchy, as the kubelet wants it to exist; on cgroup v1 its cpuset gets its
// parent's CPUs and memory nodes, which a new cpuset cgroup lacks.
func makeCgroupRoot(parent string) error {
	if parent == "" {
		return nil
	}
	hierarchies := []string{cgroupRoot}
	if CgroupHierarchy() == "v1" {
		hierarchies, _ = filepath.Glob(filepath.Join(cgroupRoot, "*"))
	}
	for _, h := range hierarchies {
		if fi, err := os.Stat(h); err != nil || !fi.IsDir() {
			continue
		}
		dir := filepath.Join(h, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("the kubelet's cgroup root: %w", err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("the kubelet's cgroup root's %s: %w", f, err)
				}
			}
		}
	}
	return nil
}

// removeNodeDir ends the shims of the node's containerd, unmounts what is mounted below its
// directory and removes it.
func removeNodeDir(dir string) {
	killShims(filepath.Join(dir, "containerd.sock"))
	unmountUnder(dir)
	_ = os.RemoveAll(dir)
}

// cgroupRoot is where the machine mounts its cgroups (v1: one hierarchy per controller
// below it; v2: the unified hierarchy itself).
const cgroupRoot = "/sys/fs/cgroup"

// podCgroups are the kubelet's pod cgroup trees under root, for both hierarchies and both
// drivers: kubepods (cgroupfs) or kubepods.slice (systemd) below the kubelet's cgroupRoot
// parent ("" or "/name"), at the root on cgroup v2 and under each controller's hierarchy on v1.
// Only those that exist are returned.
func podCgroups(root, parent string) []string {
	var dirs []string
	for _, pattern := range []string{"kubepods", "kubepods.slice", "*" + parent + "/kubepods", "*" + parent + "/kubepods.slice"} {
		if parent != "" && !strings.HasPrefix(pattern, "*") {
			pattern = parent[1:] + "/" + pattern
		}
		found, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, d := range found {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// killPodProcesses SIGKILLs every process in the pod cgroups of the kubelet whose cgroupRoot is
// parent, until none is left, so that no container outlives its node.
func killPodProcesses(parent string) {
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var pids []int
		for _, dir := range podCgroups(cgroupRoot, parent) {
			pids = append(pids, pidsIn(dir)...)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0, nil
	})
}

// pidsIn lists the processes of a cgroup directory and of all below it.
func pidsIn(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removePodCgroups removes the emptied pod cgroups under root of the kubelet whose cgroupRoot
// is parent, deepest first, in every hierarchy, and then parent itself.
func removePodCgroups(root, parent string) {
	for _, h := range podCgroups(root, parent) {
		var dirs []string
		_ = filepath.WalkDir(h, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			_ = unix.Rmdir(d)
		}
	}
	if parent == "" {
		return
	}
	own, _ := filepath.Glob(filepath.Join(root, "*"+parent))
	for _, d := range append(own, filepath.Join(root, parent)) {
		_ = unix.Rmdir(d)
	}
}

// killShims ends the containerd shims that still serve the node's containerd (its address is
// on their command line), which a crashed containerd leaves behind.
func killShims(socket string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && slices.Contains(args, socket) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount below dir (container root filesystems, volumes, the
// sandboxes' /dev/shm), deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	slices.Reverse(mounts)
	for _, m := range mounts {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
}
