package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A scrape before any SIGTERM shows each decision at 0, so that "no evacuation decided" can be
// told from a metric that is not there.
func TestSignalDecisionsAreServedFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	if n, err := testutil.GatherAndCount(reg, "lifeboat_agent_graceful_shutdown_signals_total"); err != nil || n != 2 {
		t.Fatalf("lifeboat_agent_graceful_shutdown_signals_total has %d series before any SIGTERM (%v); want one per decision, at 0", n, err)
	}
}
