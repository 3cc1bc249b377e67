package agent

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the agent's Prometheus metrics.
type Metrics struct {
	// Launchers is the number of launchers whose libvirt the agent is connected to.
	Launchers prometheus.Gauge
	// Signals counts graceful-shutdown signals launchers reported.
	Signals prometheus.Counter
}

// NewMetrics registers the agent's metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Launchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_launchers", Help: "Launchers whose libvirt daemon the agent is connected to.",
		}),
		Signals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_graceful_shutdown_signals_total", Help: "SIGTERMs launchers reported to the agent.",
		}),
	}
	reg.MustRegister(m.Launchers, m.Signals)
	return m
}
