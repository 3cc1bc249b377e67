package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// cpuV1Root is where cgroup v1's cpu controller is mounted, on machines that have it.
const cpuV1Root = "/sys/fs/cgroup/cpu"

// CPUGroupsAvailable says why nodes cannot give their pods a CPU share of their own
// (Config.PodCPUShares) on this machine, or nil if they can: it needs cgroup v1's cpu
// controller at /sys/fs/cgroup/cpu, writable.
func CPUGroupsAvailable() error {
	if _, err := os.Stat(filepath.Join(cpuV1Root, "cpu.shares")); err != nil {
		return fmt.Errorf("cgroup v1's cpu controller is not mounted at %s: %w", cpuV1Root, err)
	}
	if err := unix.Access(cpuV1Root, unix.W_OK); err != nil {
		return fmt.Errorf("cannot make cpu cgroups in %s: %w", cpuV1Root, err)
	}
	return nil
}

// newCPUGroup makes a cpu cgroup for the containers of node with shares, and returns its
// directory.
func newCPUGroup(node string, shares uint64) (string, error) {
	if err := CPUGroupsAvailable(); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(cpuV1Root, "lifeboat-node-"+node+"-")
	if err != nil {
		return "", fmt.Errorf("making the pods' cpu cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.FormatUint(shares, 10)), 0); err != nil {
		_ = os.Remove(dir)
		return "", fmt.Errorf("setting the pods' cpu shares to %d: %w", shares, err)
	}
	return dir, nil
}

// removeCPUGroup removes the cgroup at dir once the last of its processes has gone: the
// kernel refuses while any is there, and a killed container's may take a moment to exit.
func removeCPUGroup(dir string) error {
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		last = os.Remove(dir)
		return last == nil || os.IsNotExist(last), nil
	})
	if err != nil {
		return fmt.Errorf("removing the pods' cpu cgroup %s: %w", dir, last)
	}
	return nil
}
