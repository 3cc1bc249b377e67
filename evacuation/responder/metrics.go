package responder

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the responder's Prometheus metrics.
type Metrics struct {
	// Answered counts Evictions lifeboat answered for good, by outcome (migrated, declined,
	// external, ended, canceled).
	Answered *prometheus.CounterVec
	// WriteFailures counts status writes (heartbeats and answers) the API server refused, by its reason.
	WriteFailures *prometheus.CounterVec
}

// NewMetrics registers the responder's metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Answered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_responder_evictions_answered_total",
			Help: "Evictions of VM pods the responder answered, by outcome (migrated, declined, external, ended, canceled).",
		}, []string{"outcome"}),
		WriteFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_responder_heartbeat_write_failures_total",
			Help: "Writes of the responder's Eviction status (heartbeats and answers) that failed, by the API server's reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.Answered, m.WriteFailures)
	return m
}
