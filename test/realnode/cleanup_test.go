package realnode

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// The kubelet's pod cgroups as each hierarchy and driver lays them out: the clean-up must find
// the processes left in them and remove them all, and touch nothing else.
func TestPodCgroupsAreFoundAndRemovedInEitherLayout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		parent string   // the kubelet's cgroupRoot
		pods   []string // pod cgroup directories, each with a cgroup.procs
		others []string // cgroups that are not the kubelet's
	}{
		{"cgroup v1, cgroupfs", "", []string{"memory/kubepods/burstable/podA", "cpu/kubepods/besteffort/podB"}, []string{"memory/system.slice", "cpu/user.slice"}},
		{"cgroup v1, systemd", "", []string{"memory/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podA.slice"}, []string{"memory/system.slice"}},
		{"cgroup v2, cgroupfs", "", []string{"kubepods/burstable/podA", "kubepods/podB"}, []string{"system.slice", "user.slice/user-0.slice"}},
		{"cgroup v2, systemd", "", []string{"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podA.slice"}, []string{"system.slice/containerd.service"}},
		// Two kubelets on one machine, each with its own cgroupRoot: one's clean-up leaves the other's pods.
		{"cgroup v1, cgroupfs, a node's own root", "/lifeboat-node-a", []string{"memory/lifeboat-node-a/kubepods/burstable/podA", "cpu/lifeboat-node-a/kubepods/podB"},
			[]string{"memory/lifeboat-node-b/kubepods/podC", "memory/kubepods/podD", "memory/system.slice"}},
		{"cgroup v2, cgroupfs, a node's own root", "/lifeboat-node-a", []string{"lifeboat-node-a/kubepods/podA"}, []string{"lifeboat-node-b/kubepods/podC", "kubepods/podD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			var want []int
			for i, dir := range append(slices.Clone(tc.pods), tc.others...) {
				if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, dir, "cgroup.procs"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if i < len(tc.pods) {
					want = append(want, i+1)
				}
			}
			var got []int
			for _, dir := range podCgroups(root, tc.parent) {
				got = append(got, pidsIn(dir)...)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("processes in the pod cgroups = %v, want %v (those of %v only)", got, want, tc.pods)
			}

			// Real cgroup directories are removable once empty; a fixture's files must go first.
			for _, dir := range append(slices.Clone(tc.pods), tc.others...) {
				if err := os.Remove(filepath.Join(root, dir, "cgroup.procs")); err != nil {
					t.Fatal(err)
				}
			}
			removePodCgroups(root, tc.parent)
			if left := podCgroups(root, tc.parent); len(left) > 0 {
				t.Errorf("pod cgroups left after removePodCgroups: %v", left)
			}
			for _, dir := range tc.others {
				if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
					t.Errorf("removePodCgroups removed %s, which is not the kubelet's: %v", dir, err)
				}
			}
		})
	}
}
