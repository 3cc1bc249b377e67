// Package pressure reads a node's memory.available eviction signal as the kubelet computes it,
// and decides which VMs to move off the node before the kubelet has to evict them (issue 20).
package pressure

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Memory is a node's memory as the kubelet's eviction manager sees it: the machine's capacity
// and the root cgroup's working set (usage less inactive file pages, which the kernel reclaims
// first). memory.available is their difference.
type Memory struct {
	Capacity, WorkingSet uint64
}

// Available is the memory.available signal, never below zero.
func (m Memory) Available() uint64 {
	if m.WorkingSet >= m.Capacity {
		return 0
	}
	return m.Capacity - m.WorkingSet
}

// ReadMemory reads the node's memory under procRoot (/proc) and cgroupRoot (/sys/fs/cgroup) as
// the kubelet does through cAdvisor and runc's cgroup library: capacity is MemTotal; usage is
// the root memory cgroup's usage_in_bytes on cgroup v1, and anon + file of the root memory.stat
// on cgroup v2 (whose root has no memory.current); inactive file pages are subtracted.
func ReadMemory(procRoot, cgroupRoot string) (Memory, error) {
	meminfo, err := os.ReadFile(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return Memory{}, fmt.Errorf("reading the node's memory: %w", err)
	}
	capacity, err := memTotal(meminfo)
	if err != nil {
		return Memory{}, err
	}
	// cgroup v1 mounts the memory controller on its own; v2 has one hierarchy.
	v1 := filepath.Join(cgroupRoot, "memory")
	if _, err := os.Stat(filepath.Join(v1, "memory.usage_in_bytes")); err == nil {
		usage, err := os.ReadFile(filepath.Join(v1, "memory.usage_in_bytes"))
		if err != nil {
			return Memory{}, fmt.Errorf("reading the node's memory usage: %w", err)
		}
		stat, err := os.ReadFile(filepath.Join(v1, "memory.stat"))
		if err != nil {
			return Memory{}, fmt.Errorf("reading the node's memory statistics: %w", err)
		}
		return workingSetV1(capacity, usage, stat)
	}
	stat, err := os.ReadFile(filepath.Join(cgroupRoot, "memory.stat"))
	if err != nil {
		return Memory{}, fmt.Errorf("reading the node's memory statistics (neither cgroup v1 nor v2 under %s): %w", cgroupRoot, err)
	}
	return workingSetV2(capacity, stat)
}

func workingSetV1(capacity uint64, usageFile, stat []byte) (Memory, error) {
	usage, err := strconv.ParseUint(strings.TrimSpace(string(usageFile)), 10, 64)
	if err != nil {
		return Memory{}, fmt.Errorf("reading the root memory cgroup's usage_in_bytes: %w", err)
	}
	fields, err := statFields(stat, "total_inactive_file")
	if err != nil {
		return Memory{}, err
	}
	return Memory{Capacity: capacity, WorkingSet: usage - min(usage, fields["total_inactive_file"])}, nil
}

func workingSetV2(capacity uint64, stat []byte) (Memory, error) {
	fields, err := statFields(stat, "anon", "file", "inactive_file")
	if err != nil {
		return Memory{}, err
	}
	usage := fields["anon"] + fields["file"]
	return Memory{Capacity: capacity, WorkingSet: usage - min(usage, fields["inactive_file"])}, nil
}

// statFields reads the named fields of a memory.stat file, all of which must be there.
func statFields(stat []byte, names ...string) (map[string]uint64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	got := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[key] {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("memory.stat: %s: %w", key, err)
		}
		got[key] = v
	}
	for _, n := range names {
		if _, ok := got[n]; !ok {
			return nil, fmt.Errorf("memory.stat has no %s", n)
		}
	}
	return got, nil
}

// memTotal is /proc/meminfo's MemTotal in bytes.
func memTotal(meminfo []byte) (uint64, error) { return meminfoField(meminfo, "MemTotal") }

// SwapTotal is the node's swap space under procRoot (/proc), zram's included: where there is
// none, no guest memory is out of its QEMU's resident set.
func SwapTotal(procRoot string) (uint64, error) {
	meminfo, err := os.ReadFile(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return 0, fmt.Errorf("reading the node's memory: %w", err)
	}
	return meminfoField(meminfo, "SwapTotal")
}

// meminfoField is a /proc/meminfo field in bytes.
func meminfoField(meminfo []byte, field string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo: %s: %w", field, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("meminfo has no %s", field)
}

// podCgroupPatterns are where the kubelet puts a pod's cgroup, relative to the memory hierarchy's
// root: cgroupfs and systemd drivers, every QoS class. %s is the pod UID, and for systemd the
// UID with dashes as underscores.
var podCgroupPatterns = []string{
	"kubepods/pod%[1]s", "kubepods/burstable/pod%[1]s", "kubepods/besteffort/pod%[1]s",
	"kubepods.slice/kubepods-pod%[2]s.slice",
	"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%[2]s.slice",
	"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%[2]s.slice",
}

// PodWorkingSet is a pod's memory working set as the kubelet ranks it (usage less inactive
// file pages), read from the pod's cgroup under cgroupRoot; false when the pod has no cgroup
// there (another runtime layout, or a node the kubelet does not run).
func PodWorkingSet(cgroupRoot, podUID string) (uint64, bool) {
	for _, base := range []string{filepath.Join(cgroupRoot, "memory"), cgroupRoot} {
		for _, p := range podCgroupPatterns {
			dir := filepath.Join(base, fmt.Sprintf(p, podUID, strings.ReplaceAll(podUID, "-", "_")))
			if ws, ok := cgroupWorkingSet(dir); ok {
				return ws, true
			}
		}
	}
	return 0, false
}

// cgroupWorkingSet reads a v1 (memory.usage_in_bytes, total_inactive_file) or v2
// (memory.current, inactive_file) cgroup's working set.
func cgroupWorkingSet(dir string) (uint64, bool) {
	for _, f := range []struct{ usage, inactive string }{
		{"memory.usage_in_bytes", "total_inactive_file"}, {"memory.current", "inactive_file"},
	} {
		usageFile, err := os.ReadFile(filepath.Join(dir, f.usage))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return 0, false
		}
		usage, err := strconv.ParseUint(strings.TrimSpace(string(usageFile)), 10, 64)
		if err != nil {
			return 0, false
		}
		fields, err := statFields(stat, f.inactive)
		if err != nil {
			return 0, false
		}
		return usage - min(usage, fields[f.inactive]), true
	}
	return 0, false
}
