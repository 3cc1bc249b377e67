package stockcluster

import (
	"testing"
	"time"
)

// TestOnAStockCluster installs lifeboat as the README says on a cluster with upstream defaults
// (the package's doc) and, on it: drains a node of LiveMigrate VMs and of a VM that is not
// migrated; plays the descheduler's protocol; takes the machine's memory toward a node's hard
// threshold; and upgrades, then uninstalls lifeboat as the README says, with a VM running.
func TestOnAStockCluster(t *testing.T) {
	s := startStock(t, stockProfile)
	s.shell(t, t.TempDir(), "kubectl lifeboat check", time.Minute)
	t.Run("a drain moves every LiveMigrate VM to the other node and completes", func(t *testing.T) { s.testDrain(t) })
	t.Run("the descheduler's protocol: 429 Evacuation in progress, then the VM moves", func(t *testing.T) { s.testDescheduler(t) })
	t.Run("memory climbing toward the kubelet's hard threshold moves the VM before the kubelet evicts", func(t *testing.T) { s.testPressure(t) })
	t.Run("an upgrade and an uninstall as the README says leave a running VM running", func(t *testing.T) { s.testUpgradeAndUninstall(t) })
}

// BenchmarkStockClusterDrain: kubectl drain of a node with two LiveMigrate VMs and one VM that is
// not migrated on the stock cluster, and the relief margin there: memory.available when lifeboat
// moved the VM as memory use climbed (as its agent read it), above the kubelet's hard threshold.
// Each run brings its cluster up. make bench-stock runs it beside BenchmarkConfiguredClusterDrain.
func BenchmarkStockClusterDrain(b *testing.B) {
	for b.Loop() {
		s := startStock(b, stockProfile)
		b.ReportMetric(s.testDrain(b).Seconds(), "drain-s")
		r := s.testPressure(b)
		b.ReportMetric(float64(r.availableAtMark-r.threshold)/(1<<20), "relief-margin-MiB")
		b.ReportMetric(r.moved.Seconds(), "relief-move-s")
	}
}

// BenchmarkConfiguredClusterDrain: the same drain on the cluster the other tests configure for
// lifeboat (the API server's webhook client certificate and the EvictionRequest API, kubelets with
// evictionSoft and evictionMaxPodGracePeriod), installed the same way on the same two real nodes.
func BenchmarkConfiguredClusterDrain(b *testing.B) {
	for b.Loop() {
		s := startStock(b, configuredProfile)
		b.ReportMetric(s.testDrain(b).Seconds(), "drain-s")
	}
}
