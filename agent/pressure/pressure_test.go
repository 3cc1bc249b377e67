package pressure

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const mib = 1 << 20

func TestReadMemory(t *testing.T) {
	meminfo := "MemTotal:       4194304 kB\nMemFree:         1048576 kB\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Memory
	}{
		{"cgroup v1: usage_in_bytes less total_inactive_file", map[string]string{
			"memory/memory.usage_in_bytes": "3221225472\n",
			"memory/memory.stat":           "cache 1\ntotal_cache 2147483648\ntotal_inactive_file 1073741824\n",
		}, Memory{Capacity: 4 << 30, WorkingSet: 2 << 30}},
		{"cgroup v2: anon + file less inactive_file", map[string]string{
			"memory.stat": "anon 1073741824\nfile 2147483648\nkernel 1\ninactive_file 536870912\n",
		}, Memory{Capacity: 4 << 30, WorkingSet: 2560 * mib}},
		{"more inactive than used: the working set is zero", map[string]string{
			"memory.stat": "anon 0\nfile 10\ninactive_file 20\n",
		}, Memory{Capacity: 4 << 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc, cgroup := t.TempDir(), t.TempDir()
			write(t, filepath.Join(proc, "meminfo"), meminfo)
			for name, content := range tc.files {
				write(t, filepath.Join(cgroup, name), content)
			}
			got, err := ReadMemory(proc, cgroup)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("ReadMemory() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadMemoryRefusesWhatItCannotRead(t *testing.T) {
	for _, tc := range []struct {
		name             string
		meminfo, v2stat  string
		wantErrSubstring string
	}{
		{"no MemTotal", "MemFree: 1 kB\n", "anon 1\nfile 1\ninactive_file 1\n", "no MemTotal"},
		{"no inactive_file", "MemTotal: 1 kB\n", "anon 1\nfile 1\n", "no inactive_file"},
		{"a field that is not a number", "MemTotal: 1 kB\n", "anon x\nfile 1\ninactive_file 1\n", "anon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc, cgroup := t.TempDir(), t.TempDir()
			write(t, filepath.Join(proc, "meminfo"), tc.meminfo)
			write(t, filepath.Join(cgroup, "memory.stat"), tc.v2stat)
			if _, err := ReadMemory(proc, cgroup); err == nil || !strings.Contains(err.Error(), tc.wantErrSubstring) {
				t.Errorf("ReadMemory() error = %v, want one about %q", err, tc.wantErrSubstring)
			}
		})
	}
}

func TestThresholdsFromKubeletConfig(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         Thresholds
		wantErr      bool
	}{
		{"soft and hard", "kind: KubeletConfiguration\nevictionSoft:\n  memory.available: 1Gi\nevictionHard:\n  memory.available: 100Mi\n",
			Thresholds{Soft: Threshold{Bytes: 1 << 30}, Hard: Threshold{Bytes: 100 * mib}}, false},
		{"percentages", "kind: KubeletConfiguration\nevictionSoft:\n  memory.available: 10%\nevictionHard:\n  memory.available: \"5%\"\n",
			Thresholds{Soft: Threshold{Percent: 10}, Hard: Threshold{Percent: 5}}, false},
		{"no evictionHard: the kubelet's default", "kind: KubeletConfiguration\n", Thresholds{Hard: Threshold{Bytes: 100 * mib}}, false},
		{"evictionHard without memory: none", "kind: KubeletConfiguration\nevictionHard:\n  nodefs.available: 10%\n", Thresholds{}, false},
		{"not a kubelet configuration", "kind: Pod\n", Thresholds{}, true},
		{"a bad quantity", "kind: KubeletConfiguration\nevictionSoft:\n  memory.available: lots\n", Thresholds{}, true},
		{"a percentage over 100", "kind: KubeletConfiguration\nevictionSoft:\n  memory.available: 120%\n", Thresholds{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ThresholdsFromKubeletConfig([]byte(tc.config))
			if (err != nil) != tc.wantErr {
				t.Fatalf("ThresholdsFromKubeletConfig() error = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("ThresholdsFromKubeletConfig() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRankIsTheKubeletsMemoryRanking(t *testing.T) {
	pods := []Pod{
		{Name: "within-request", Usage: 900 * mib, Request: 1024 * mib},
		{Name: "over-by-100-prio-10", Usage: 300 * mib, Request: 200 * mib, Priority: 10},
		{Name: "over-by-50", Usage: 250 * mib, Request: 200 * mib},
		{Name: "over-by-400", Usage: 600 * mib, Request: 200 * mib},
		{Name: "within-request-prio-neg", Usage: 10 * mib, Request: 100 * mib, Priority: -5},
	}
	Rank(pods)
	var got []string
	for _, p := range pods {
		got = append(got, p.Name)
	}
	want := []string{"over-by-400", "over-by-50", "over-by-100-prio-10", "within-request-prio-neg", "within-request"}
	if !slices.Equal(got, want) {
		t.Errorf("Rank() = %v, want %v", got, want)
	}
}

func TestRelieve(t *testing.T) {
	const gib = 1 << 30
	soft := Thresholds{Soft: Threshold{Bytes: 1 * gib}, Hard: Threshold{Bytes: 100 * mib}}
	margin := uint64(512 * mib)
	at := func(available uint64) Memory { return Memory{Capacity: 16 * gib, WorkingSet: 16*gib - available} }
	vm := func(name string, usage, request uint64) Pod {
		return Pod{Name: name, Usage: usage, Request: request, Movable: true}
	}
	big, small, within := vm("big", 800*mib, 256*mib), vm("small", 300*mib, 256*mib), vm("within", 200*mib, 512*mib)
	pinned := big
	pinned.Name, pinned.Movable = "pinned", false
	moving := small
	moving.Moving = true
	for _, tc := range []struct {
		name       string
		mem        Memory
		thresholds Thresholds
		pods       []Pod
		want       []string
		wantShort  uint64
		wantEnough bool
	}{
		{"above the line: nothing", at(2 * gib), soft, []Pod{big, small}, nil, 0, true},
		{"exactly on the line: nothing", at(1*gib + 512*mib), soft, []Pod{big, small}, nil, 0, true},
		{"short by 100 MiB: the first the kubelet would evict", at(1*gib + 412*mib), soft, []Pod{small, within, big}, []string{"big"}, 100 * mib, true},
		{"short by 1 GiB: as many as it takes, in the kubelet's order", at(512 * mib), soft, []Pod{within, small, big}, []string{"big", "small"}, 1 * gib, true},
		{"a VM that cannot migrate is skipped", at(1*gib + 412*mib), soft, []Pod{pinned, small}, []string{"small"}, 100 * mib, true},
		{"not enough movable VMs: all of them, and it says so", at(256 * mib), soft, []Pod{small, within}, []string{"small", "within"}, 1280 * mib, false},
		{"a relief still moving: no new decision", at(512 * mib), soft, []Pod{big, moving}, nil, 1 * gib, false},
		{"no soft threshold: the hard one", at(300 * mib), Thresholds{Hard: Threshold{Bytes: 100 * mib}}, []Pod{big}, []string{"big"}, 312 * mib, true},
		{"a percentage of capacity", at(2 * gib), Thresholds{Soft: Threshold{Percent: 15}}, []Pod{small, big}, []string{"big", "small"}, 16*gib*15/100 + 512*mib - 2*gib, true},
		{"no threshold at all: nothing", at(0), Thresholds{}, []Pod{big}, nil, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Relieve(tc.mem, tc.thresholds, margin, tc.pods)
			var got []string
			for _, p := range r.Move {
				got = append(got, p.Name)
			}
			if !slices.Equal(got, tc.want) || r.Short != tc.wantShort || r.Enough != tc.wantEnough {
				t.Errorf("Relieve() moves %v, short %d MiB, enough %v; want %v, short %d MiB, enough %v",
					got, r.Short/mib, r.Enough, tc.want, tc.wantShort/mib, tc.wantEnough)
			}
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestMetricsReportTheSignalAndTheThresholds(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	mem := Memory{Capacity: 8 << 30, WorkingSet: 6 << 30}
	RegisterMetrics(reg, func() (Memory, error) { return mem, nil }, Thresholds{Soft: Threshold{Percent: 25}, Hard: Threshold{Bytes: 100 * mib}})
	want := `
# HELP lifeboat_agent_node_memory_available_bytes The node's memory.available eviction signal as the kubelet computes it: capacity less the root cgroup's working set.
# TYPE lifeboat_agent_node_memory_available_bytes gauge
lifeboat_agent_node_memory_available_bytes 2.147483648e+09
# HELP lifeboat_agent_node_memory_eviction_threshold_bytes The kubelet's memory.available eviction thresholds on this node (evictionSoft, evictionHard).
# TYPE lifeboat_agent_node_memory_eviction_threshold_bytes gauge
lifeboat_agent_node_memory_eviction_threshold_bytes{threshold="hard"} 1.048576e+08
lifeboat_agent_node_memory_eviction_threshold_bytes{threshold="soft"} 2.147483648e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestPodWorkingSet(t *testing.T) {
	const uid = "0b6c2a3e-1f2d-4c5b-9a8e-7d6c5b4a3f21"
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"cgroupfs, v1, burstable", map[string]string{
			"memory/kubepods/burstable/pod" + uid + "/memory.usage_in_bytes": "1073741824\n",
			"memory/kubepods/burstable/pod" + uid + "/memory.stat":           "total_inactive_file 268435456\n",
		}},
		{"systemd, v2, best effort", map[string]string{
			"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b6c2a3e_1f2d_4c5b_9a8e_7d6c5b4a3f21.slice/memory.current": "1073741824\n",
			"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b6c2a3e_1f2d_4c5b_9a8e_7d6c5b4a3f21.slice/memory.stat":    "anon 1\ninactive_file 268435456\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				write(t, filepath.Join(root, name), content)
			}
			got, ok := PodWorkingSet(root, uid)
			if !ok || got != 768*mib {
				t.Errorf("PodWorkingSet() = %d MiB, %v; want 768 MiB, true", got/mib, ok)
			}
		})
	}
	if _, ok := PodWorkingSet(t.TempDir(), uid); ok {
		t.Error("PodWorkingSet() found a pod with no cgroup")
	}
}

func TestSwapTotal(t *testing.T) {
	for _, tc := range []struct {
		name, meminfo string
		want          uint64
		wantErr       string
	}{
		{"swap", "MemTotal: 4194304 kB\nSwapTotal:       2097152 kB\nSwapFree: 1 kB\n", 2 << 30, ""},
		{"none", "MemTotal: 4194304 kB\nSwapTotal:             0 kB\n", 0, ""},
		{"not said", "MemTotal: 4194304 kB\n", 0, "no SwapTotal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			write(t, filepath.Join(proc, "meminfo"), tc.meminfo)
			got, err := SwapTotal(proc)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("SwapTotal() = %d, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("SwapTotal() = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	if _, err := SwapTotal(t.TempDir()); err == nil {
		t.Error("SwapTotal() of a /proc without meminfo gave no error")
	}
}
