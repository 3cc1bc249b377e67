package realnode

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
)

// TestTheAgentsMemorySignalIsTheKubelets: the agent computes memory.available from the node's
// files (pressure.ReadMemory); the real kubelet's summary API serves the figure its eviction
// manager acts on. Sampled at the moment the kubelet's statistics were taken, the two agree.
func TestTheAgentsMemorySignalIsTheKubelets(t *testing.T) {
	node := startNode(t)
	type sample struct {
		at        time.Time
		available uint64
	}
	var mu sync.Mutex
	var ours []sample
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			m, err := pressure.ReadMemory("/proc", "/sys/fs/cgroup")
			if err != nil {
				t.Errorf("ReadMemory() = %v", err)
				return
			}
			mu.Lock()
			ours = append(ours, sample{time.Now(), m.Available()})
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	// The machine's memory moves while other tests run: a few of the kubelet's figures are
	// compared, and one close match is what shows the computation is the same.
	const tolerance = 16 << 20
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, 2*time.Minute, false, func(ctx context.Context) (bool, error) {
		theirs, at, err := node.MemoryAvailableAt(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		mu.Lock()
		defer mu.Unlock()
		var nearest *sample
		for i := range ours {
			if nearest == nil || ours[i].at.Sub(at).Abs() < nearest.at.Sub(at).Abs() {
				nearest = &ours[i]
			}
		}
		if nearest == nil || nearest.at.Sub(at).Abs() > 100*time.Millisecond {
			last = "no sample of ours within 100 ms of the kubelet's at " + at.String()
			return false, nil
		}
		diff := int64(nearest.available) - theirs
		t.Logf("kubelet's memory.available %d MiB at %s; ours %d MiB at %s (difference %d MiB)",
			theirs>>20, at.Format("15:04:05.000"), nearest.available>>20, nearest.at.Format("15:04:05.000"), diff>>20)
		return diff > -tolerance && diff < tolerance, nil
	})
	cancel()
	<-sampled
	if err != nil {
		t.Fatalf("the agent's memory.available never came within %d MiB of the kubelet's: %v (last: %s)", tolerance>>20, err, last)
	}
}
