package pressure

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics exposes the node's memory.available, as read at each scrape, and the kubelet's
// thresholds for it: what relief decides from, beside the kubelet's own figures.
func RegisterMetrics(reg prometheus.Registerer, read func() (Memory, error), t Thresholds) {
	gauge := func(f func(Memory) float64) func() float64 {
		return func() float64 {
			m, err := read()
			if err != nil {
				return math.NaN()
			}
			return f(m)
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lifeboat_agent_node_memory_available_bytes",
			Help: "The node's memory.available eviction signal as the kubelet computes it: capacity less the root cgroup's working set.",
		}, gauge(func(m Memory) float64 { return float64(m.Available()) })),
	)
	for name, th := range map[string]Threshold{"soft": t.Soft, "hard": t.Hard} {
		if !th.Set() {
			continue
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "lifeboat_agent_node_memory_eviction_threshold_bytes",
			Help:        "The kubelet's memory.available eviction thresholds on this node (evictionSoft, evictionHard).",
			ConstLabels: prometheus.Labels{"threshold": name},
		}, gauge(func(m Memory) float64 { return float64(th.Of(m.Capacity)) })))
	}
}
