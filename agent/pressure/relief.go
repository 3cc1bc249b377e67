package pressure

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// Threshold is one memory.available eviction threshold of the kubelet: a quantity, or a
// percentage of the node's capacity. The zero Threshold is no threshold.
type Threshold struct {
	Bytes   uint64
	Percent float64
}

// Of is the threshold in bytes on a node with capacity, truncated as the kubelet does.
func (t Threshold) Of(capacity uint64) uint64 {
	if t.Percent > 0 {
		return uint64(float64(capacity) * t.Percent / 100)
	}
	return t.Bytes
}

// Set reports whether there is a threshold.
func (t Threshold) Set() bool { return t.Bytes > 0 || t.Percent > 0 }

// Thresholds are the kubelet's memory.available thresholds.
type Thresholds struct{ Soft, Hard Threshold }

// kubeletDefaultHard is the kubelet's evictionHard memory.available when its configuration
// sets no evictionHard at all.
var kubeletDefaultHard = Threshold{Bytes: 100 << 20}

// ThresholdsFromKubeletConfig reads evictionSoft and evictionHard's memory.available from a
// KubeletConfiguration file. A configuration without evictionHard has the kubelet's default;
// one that sets evictionHard without memory.available has none (the kubelet merges no
// defaults unless mergeDefaultEvictionSettings, which lifeboat does not read, says so).
func ThresholdsFromKubeletConfig(data []byte) (Thresholds, error) {
	var cfg struct {
		Kind         string            `json:"kind"`
		EvictionSoft map[string]string `json:"evictionSoft"`
		EvictionHard map[string]string `json:"evictionHard"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return Thresholds{}, fmt.Errorf("reading the kubelet configuration: %w", err)
	}
	if cfg.Kind != "KubeletConfiguration" {
		return Thresholds{}, fmt.Errorf("the kubelet configuration has kind %q, want KubeletConfiguration", cfg.Kind)
	}
	var t Thresholds
	var err error
	if t.Soft, err = parseThreshold(cfg.EvictionSoft["memory.available"]); err != nil {
		return Thresholds{}, fmt.Errorf("evictionSoft: %w", err)
	}
	if cfg.EvictionHard == nil {
		t.Hard = kubeletDefaultHard
	} else if t.Hard, err = parseThreshold(cfg.EvictionHard["memory.available"]); err != nil {
		return Thresholds{}, fmt.Errorf("evictionHard: %w", err)
	}
	return t, nil
}

// parseThreshold reads "1Gi" or "10%" as the kubelet does; empty is no threshold.
func parseThreshold(s string) (Threshold, error) {
	if s == "" {
		return Threshold{}, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || v > 100 {
			return Threshold{}, fmt.Errorf("memory.available %q: want a percentage from 0 to 100", s)
		}
		return Threshold{Percent: v}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() < 0 {
		return Threshold{}, fmt.Errorf("memory.available %q: want a quantity such as 1Gi or a percentage", s)
	}
	return Threshold{Bytes: uint64(q.Value())}, nil
}

// Pod is a pod on the node as the kubelet's memory ranking sees it, and whether lifeboat may
// move it: a VM that can live-migrate and is not moving already.
type Pod struct {
	Name            string
	Usage, Request  uint64 // working set and memory request, bytes
	Priority        int32
	Movable, Moving bool
}

// Rank orders pods as the kubelet's eviction manager does under memory pressure
// (rankMemoryPressure): pods using more than their request first, then lower priority, then
// the larger use above the request.
func Rank(pods []Pod) {
	slices.SortStableFunc(pods, func(a, b Pod) int {
		if c := cmp.Compare(b.exceedsRequest(), a.exceedsRequest()); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		return cmp.Compare(b.aboveRequest(), a.aboveRequest())
	})
}

func (p Pod) exceedsRequest() int {
	if p.Usage > p.Request {
		return 1
	}
	return 0
}

func (p Pod) aboveRequest() int64 { return int64(p.Usage) - int64(p.Request) }

// Acting is the threshold relief keeps the node above: the soft one, or the hard one where
// there is no soft; unset when the kubelet has neither.
func (t Thresholds) Acting() Threshold {
	if t.Soft.Set() {
		return t.Soft
	}
	return t.Hard
}

// Relief is a relief decision: the VMs to move, and how far below the relief line the node is.
type Relief struct {
	Move []Pod
	// Line is the memory.available below which relief acts: the acting threshold plus the
	// margin; zero when the kubelet has no threshold.
	Line uint64
	// Short is how much memory.available lacks to reach the soft threshold plus the margin;
	// zero when the node is above that line.
	Short uint64
	// Enough is false when moving every movable VM would still leave the node short.
	Enough bool
}

// Relieve decides which VMs to move off a node whose memory.available (mem) has come within
// margin of the kubelet's soft threshold (its hard one where there is no soft): those the
// kubelet would evict first among the movable ones, just enough of them for the node to be
// back above the line once they are gone. It decides nothing while a VM of the node is moving
// (marked or migrating, for relief or another cause: its memory is not freed until it has left),
// and never picks a VM that cannot live-migrate.
func Relieve(mem Memory, t Thresholds, margin uint64, pods []Pod) Relief {
	threshold := t.Acting()
	if !threshold.Set() {
		return Relief{Enough: true}
	}
	line := threshold.Of(mem.Capacity) + margin
	available := mem.Available()
	if available >= line {
		return Relief{Line: line, Enough: true}
	}
	r := Relief{Line: line, Short: line - available}
	if slices.ContainsFunc(pods, func(p Pod) bool { return p.Moving }) {
		return r
	}
	ranked := slices.Clone(pods)
	Rank(ranked)
	var freed uint64
	for _, p := range ranked {
		if freed >= r.Short {
			break
		}
		if !p.Movable {
			continue
		}
		r.Move = append(r.Move, p)
		freed += p.Usage
	}
	r.Enough = freed >= r.Short
	return r
}
