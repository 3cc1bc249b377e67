package cancellation

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Outcomes of a cancel request, for the metric.
const (
	OutcomeCancelled = "cancelled"
	OutcomeRefused   = "refused"
)

// Decide says whether a cancel request on vmi is carried out, and if not, why. A mark with a
// deadline is one whose launcher pod is already being stopped (the kubelet's node pressure, a
// deletion): the pod goes at the deadline whatever is cancelled, so cancelling would only lose
// the VM, and the request is refused. A mark without one (a drain's, an EvictionRequest's) can be
// called off: the pod stays.
func Decide(vmi *v1alpha1.VirtualMachineInstance) (cancel bool, why string) {
	marked := vmi.Status.EvacuationNodeName != "" && vmi.Status.EvacuationNodeName == vmi.Status.NodeName
	if !marked || vmi.Status.EvacuationDeadline == nil {
		return true, ""
	}
	return false, fmt.Sprintf("the launcher pod on node %s is already being stopped (%s): it goes at %s whatever is cancelled, and only the migration saves the VM",
		vmi.Status.NodeName, vmi.EvacuationCause(), vmi.Status.EvacuationDeadline.UTC().Format(time.RFC3339))
}

// Metrics are the cancellation controller's Prometheus metrics.
type Metrics struct {
	// Requests counts cancel requests by outcome (cancelled, refused): a drain whose cancels
	// keep coming shows here.
	Requests *prometheus.CounterVec
}

// NewMetrics registers the cancellation controller's metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lifeboat_evacuation_cancel_requests_total",
		Help: "Requests to cancel an evacuation (annotation lifeboat.dev/cancel-evacuation), by outcome (cancelled, refused).",
	}, []string{"outcome"})}
	reg.MustRegister(m.Requests)
	return m
}
