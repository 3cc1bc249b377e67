package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	rotations prometheus.Counter
	// unauthenticated counts requests refused because they did not come from the API server.
	unauthenticated prometheus.Counter
	// unauthenticatedReviews counts reviews answered in permissive mode without authentication.
	unauthenticatedReviews *prometheus.CounterVec
	mode                   *prometheus.GaugeVec
}

// newMetrics registers the webhook's metrics; expiry is when its serving certificate expires.
func newMetrics(reg prometheus.Registerer, expiry func() time.Time) metrics {
	m := metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_eviction_webhook_decisions_total",
			Help: "Evictions the webhook answered, by the VM's eviction strategy (NotAVM for other pods) and the answer (allowed, evacuating, in-progress, denied, bounded).",
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
		unauthenticated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_eviction_webhook_unauthenticated_requests_total",
			Help: "Admission reviews refused (403, no side effect) because the caller did not present the API server's client certificate (strict mode).",
		}),
		unauthenticatedReviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_eviction_webhook_unauthenticated_reviews_total",
			Help: "Admission reviews answered in permissive mode although the caller did not present the API server's client certificate, by answer (bounded: refused beyond what such a review may cause).",
		}, []string{"answer"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lifeboat_eviction_webhook_mode",
			Help: "1 for this replica's mode of the eviction webhook (strict: only the API server presenting its client certificate; permissive: reviews it cannot authenticate too, within bounds), 0 for the other.",
		}, []string{"mode"}),
	}
	// Rotation replaces the certificate at two thirds of its life: one near its end means
	// rotation is failing, and the API server will soon refuse to call the webhook.
	certExpiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lifeboat_eviction_webhook_certificate_expiry_timestamp_seconds",
		Help: "When this replica's serving certificate expires (Unix time).",
	}, func() float64 { return float64(expiry().Unix()) })
	// Present from the start, so that an alert on its increase sees the first one.
	m.unauthenticatedReviews.WithLabelValues(string(AnswerBounded))
	reg.MustRegister(m.decisions, m.latency, m.rotations, m.unauthenticated, m.unauthenticatedReviews, m.mode, certExpiry)
	return m
}

func (m metrics) setMode(mode Mode) {
	for _, each := range []Mode{ModeStrict, ModePermissive} {
		v := 0.0
		if each == mode {
			v = 1
		}
		m.mode.WithLabelValues(string(each)).Set(v)
	}
}
