package stockcluster

import (
	"testing"
	"time"
)

// TestOnAStockCluster installs lifeboat as the README says on a cluster with upstream defaults
// (the package's doc) and, on it: drains a node of LiveMigrate VMs and of a VM that is not
// migrated; plays the descheduler's protocol; and takes the machine's memory toward a node's
// hard threshold.
func TestOnAStockCluster(t *testing.T) {
	s := startStock(t, stockProfile)
	s.shell(t, t.TempDir(), "kubectl lifeboat check", time.Minute)
	t.Run("a drain moves every LiveMigrate VM to the other node and completes", func(t *testing.T) { s.testDrain(t) })
	t.Run("the descheduler's protocol: 429 Evacuation in progress, then the VM moves", func(t *testing.T) { s.testDescheduler(t) })
	t.Run("memory climbing toward the kubelet's hard threshold moves the VM before the kubelet evicts", func(t *testing.T) { s.testPressure(t) })
}

// BenchmarkStockClusterDrain: kubectl drain of a node with two LiveMigrate VMs and one VM that is
// not migrated, on the stock cluster and on the cluster the other tests configure for lifeboat
// (API server's webhook client certificate and EvictionRequest API, kubelet with evictionSoft
// and evictionMaxPodGracePeriod); on the stock one also the relief margin: memory.available when
// lifeboat marked the VM as memory use climbed, above the kubelet's hard threshold. Each run
// brings its cluster up (not timed).
func BenchmarkStockClusterDrain(b *testing.B) {
	for _, p := range []profile{stockProfile, configuredProfile} {
		b.Run("cluster="+p.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				s := startStock(b, p)
				drain := s.testDrain(b)
				b.ReportMetric(drain.Seconds(), "drain-s")
				if p.name == stockProfile.name {
					r := s.testPressure(b)
					b.ReportMetric(float64(r.availableAtMark-r.threshold)/(1<<20), "relief-margin-MiB")
					b.ReportMetric(r.moved.Seconds(), "relief-move-s")
				}
				b.StartTimer()
			}
		})
	}
}
