package webhook

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	rotations prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_eviction_webhook_decisions_total",
			Help: "Evictions the webhook answered, by the VM's eviction strategy (NotAVM for other pods) and the answer (allowed, evacuating, in-progress, denied).",
		}, []string{"strategy", "answer"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lifeboat_eviction_webhook_duration_seconds",
			Help:    "Time the webhook took to answer an eviction, marking included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_eviction_webhook_certificate_rotations_total",
			Help: "Serving certificates replaced before they expired.",
		}),
	}
	reg.MustRegister(m.decisions, m.latency, m.rotations)
	return m
}
