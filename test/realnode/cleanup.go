package realnode

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// dirPrefix names the nodes' directories in the temporary directory.
const dirPrefix = "lbr"

// sweepStale removes what a real node whose test binary was killed left: its containers'
// processes and cgroups, its shims, its mounts and its directory. The caller holds the lock
// that only a live real node holds, so whatever is found is stale.
func sweepStale() {
	killPodProcesses()
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "containerd.toml")); err == nil {
			removeNodeDir(d)
		}
	}
	removePodCgroups(cgroupRoot)
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
// drivers: kubepods (cgroupfs) or kubepods.slice (systemd), at the root on cgroup v2 and under
// each controller's hierarchy on v1. Only those that exist are returned.
func podCgroups(root string) []string {
	var dirs []string
	for _, pattern := range []string{"kubepods", "kubepods.slice", "*/kubepods", "*/kubepods.slice"} {
		found, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, d := range found {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// killPodProcesses SIGKILLs every process in the kubelet's pod cgroups, until none is left,
// so that no container outlives its node.
func killPodProcesses() {
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var pids []int
		for _, dir := range podCgroups(cgroupRoot) {
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

// removePodCgroups removes the emptied pod cgroups under root, deepest first, in every hierarchy.
func removePodCgroups(root string) {
	for _, h := range podCgroups(root) {
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
