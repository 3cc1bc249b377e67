package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// TestDeletionKillsDetachedProcesses: a launcher's libvirtd and QEMU may leave its session and
// ignore SIGTERM; they must still not outlive the pod.
func TestDeletionKillsDetachedProcesses(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	// The grandchild's sleep duration is unique, so that it can be told apart on this machine.
	marker := strconv.Itoa(1_000_000 + rand.IntN(1_000_000))
	pod := createPod(t, ns, shPod(node, "detached", `setsid sh -c 'trap "" TERM; exec sleep `+marker+`' & wait`))
	waitForPod(t, ns, pod.Name, "Running", hasPhase(corev1.PodRunning))

	pid := waitForProcess(t, "sleep", marker)
	if sid := sessionOf(t, pid); sid != pid {
		t.Fatalf("the grandchild (pid %d) is in session %d: want a session of its own", pid, sid)
	}
	if !ignoresSIGTERM(t, pid) {
		t.Fatalf("the grandchild (pid %d) does not ignore SIGTERM", pid)
	}

	if err := cluster.Kube.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}
	waitForPodGone(t, ns, pod.Name)
	// The node deletes the pod only after the container's init exited, and the kernel has
	// killed the rest of the PID namespace by then.
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Equal(cmdline, []byte("sleep\x00"+marker+"\x00")) {
		t.Errorf("the detached grandchild (pid %d) outlived its pod", pid)
	}
}

// waitForProcess finds the process running exactly name arg on this machine.
func waitForProcess(t *testing.T, name, arg string) int {
	t.Helper()
	want := []byte(name + "\x00" + arg + "\x00")
	var found int
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return false, err
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Equal(cmdline, want) {
				found = pid
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("expected a process %q running: %v", strings.ReplaceAll(string(want), "\x00", " "), err)
	}
	return found
}

// sessionOf reads a process's session ID, the sixth field of /proc/<pid>/stat.
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("reading the state of pid %d: %v", pid, err)
	}
	// The command name, in parentheses, may contain spaces: count fields after it.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	sid, err := strconv.Atoi(fields[3])
	if err != nil {
		t.Fatalf("parsing the session of pid %d from %q: %v", pid, stat, err)
	}
	return sid
}

func ignoresSIGTERM(t *testing.T, pid int) bool {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			ignored, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", line, err)
			}
			return ignored&(1<<(15-1)) != 0
		}
	}
	t.Fatalf("no SigIgn in the status of pid %d", pid)
	return false
}

// TestPodCPUSharesHoldEveryProcessOfTheContainer: with PodCPUShares, what a container's
// command starts, in a session of its own too (as libvirtd starts QEMU), is in the node's cpu
// cgroup with those shares, and the cgroup goes with the node.
func TestPodCPUSharesHoldEveryProcessOfTheContainer(t *testing.T) {
	if err := CPUGroupsAvailable(); err != nil {
		t.Skipf("needs cgroup v1's cpu controller at %s, writable (make test lists this skip): %v", cpuV1Root, err)
	}
	t.Parallel()
	const shares = 100
	ns := testNamespace(t)
	node := startNodes(t, 1, func(c *Config) { c.PodCPUShares = shares })[0]
	marker := strconv.Itoa(1_000_000 + rand.IntN(1_000_000))
	pod := createPod(t, ns, shPod(node, "shared", "setsid sleep "+marker+" & wait"))
	waitForPod(t, ns, pod.Name, "Running", hasPhase(corev1.PodRunning))
	pid := waitForProcess(t, "sleep", marker)
	group := cpuGroupOf(t, pid)
	if group == "/" {
		t.Fatalf("the container's grandchild (pid %d) is in the machine's root cpu cgroup: want the node's", pid)
	}
	dir := filepath.Join(cpuV1Root, group)
	got, err := os.ReadFile(filepath.Join(dir, "cpu.shares"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != strconv.Itoa(shares) {
		t.Errorf("the cpu cgroup %s of the container's grandchild has shares %s: want the node's PodCPUShares, %d", group, got, shares)
	}
	node.Stop()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the node's cpu cgroup %s is still there after the node stopped (%v)", dir, err)
	}
}

// cpuGroupOf is the cgroup v1 cpu group of pid, as /proc/pid/cgroup names it.
func cpuGroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "cpu") {
			return parts[2]
		}
	}
	t.Fatalf("pid %d has no cpu cgroup in %q", pid, b)
	return ""
}

// TestHostPathVolumes: node-private host paths are each node's own, other host paths are the
// machine's, and mounts are seen inside the pod only.
func TestHostPathVolumes(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	nodes := startNodes(t, 2)
	private := fmt.Sprintf("/var/run/lifeboat/test-%d", rand.Int64())
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "in"), []byte("from the machine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mounts := t.TempDir()
	data, sameData, sharedMount := filepath.Join(mounts, "data"), filepath.Join(mounts, "same"), filepath.Join(mounts, "shared")
	script := fmt.Sprintf(`if [ -e %[1]s/who ]; then echo "found $(cat %[1]s/who)"; else echo fresh; fi
echo "$NODE_NAME" > %[1]s/who
cat %[2]s/who %[3]s/in
if touch %[3]s/f 2>/dev/null; then echo writable; else echo read-only; fi`, data, sameData, sharedMount)

	// One node after the other: the second must not find what the first wrote.
	for _, node := range nodes {
		pod := shPod(node, "writer-"+node.Name(), script)
		pod.Spec.Volumes = []corev1.Volume{
			{Name: "private", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: private, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
			{Name: "same", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: strings.TrimPrefix(private, "/var")}}},
			{Name: "shared", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: shared, Type: ptr.To(corev1.HostPathDirectory)}}},
		}
		c := &pod.Spec.Containers[0]
		c.Env = []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
		c.VolumeMounts = []corev1.VolumeMount{
			{Name: "private", MountPath: data},
			{Name: "same", MountPath: sameData},
			{Name: "shared", MountPath: sharedMount, ReadOnly: true},
		}
		pod = createPod(t, ns, pod)
		pod = waitForPod(t, ns, pod.Name, "Succeeded", hasPhase(corev1.PodSucceeded))
		waitForLog(t, node, pod, "main", "fresh\n"+node.Name()+"\nfrom the machine\nread-only\n")

		written, err := os.ReadFile(filepath.Join(node.HostPath(private), "who"))
		if err != nil || string(written) != node.Name()+"\n" {
			t.Errorf("node %s: %s holds %q (%v), want the node's name", node.Name(), node.HostPath(private), written, err)
		}
	}
	for _, path := range []string{filepath.Join(data, "who"), filepath.Join(private, "who"), filepath.Join(shared, "f")} {
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists outside the pods (%v): want the pods' mounts private and read-only where asked", path, err)
		}
	}
}
