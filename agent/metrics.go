package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
)

// Metrics are the agent's Prometheus metrics.
type Metrics struct {
	// Launchers is the number of launchers whose libvirt the agent is connected to.
	Launchers prometheus.Gauge
	// SignalDecisions counts launchers' SIGTERMs by what the agent decided: evacuate or shutdown.
	SignalDecisions *prometheus.CounterVec
	// MarkLatency is the time from the launcher receiving SIGTERM to the API server accepting the mark.
	MarkLatency prometheus.Histogram
	// EvacuationsLost counts marked VMs still on the node when their deadline passed.
	EvacuationsLost prometheus.Counter
	// LauncherRescans counts rescans of the launcher directories after the watch lost events.
	LauncherRescans prometheus.Counter
	// LauncherDirsRemoved counts per-VMI directories removed after their launcher pods were deleted.
	LauncherDirsRemoved prometheus.Counter
	// PodNetworks counts pod networks built in launcher pods, by binding and result.
	PodNetworks *prometheus.CounterVec
	// SourceForwards counts migration source pods made to forward to their target pods, by
	// result (started, skipped, failed).
	SourceForwards *prometheus.CounterVec
	// LauncherImpostors counts pods on the node that claim to be a VMI's launcher by their
	// labels but are not the pod lifeboat's controller recorded for it; each is refused once.
	LauncherImpostors prometheus.Counter
	// LibvirtCallsAbandoned counts calls to launchers' libvirt abandoned at their deadline, by
	// call (deadlines.go); each cut its launcher's connection.
	LibvirtCallsAbandoned *prometheus.CounterVec
	// LauncherLibvirtdRestarts counts the restarts of launchers' libvirtd that launchers reported;
	// LibvirtdRestartReportsDropped those reported beyond what a launcher makes.
	LauncherLibvirtdRestarts      prometheus.Counter
	LibvirtdRestartReportsDropped prometheus.Counter
	// LauncherConnectFailures counts connections to launchers' libvirt that failed or ended early.
	LauncherConnectFailures prometheus.Counter
	// LauncherReportsUnlogged counts launchers' reports handled but not logged, over their budget.
	LauncherReportsUnlogged prometheus.Counter
	// MigrationConnectionsRefused counts connections to target proxies whose TLS handshake failed.
	MigrationConnectionsRefused prometheus.Counter
	// ReliefDecisions counts node-pressure relief decisions by result; ReliefAvailable is the
	// node's memory.available at each decision.
	ReliefDecisions *prometheus.CounterVec
	ReliefAvailable prometheus.Histogram
	// ReliefLine is the memory.available below which relief moves VMs, so that a dashboard can
	// draw it beside the node's memory.available and the kubelet's thresholds.
	ReliefLine prometheus.Gauge
	// DirtyRateEstimates counts the dirty rates sampled at migrations' starts, by result
	// (agent.SampleResult); DirtyRateEstimated is the rates measured.
	DirtyRateEstimates *prometheus.CounterVec
	DirtyRateEstimated prometheus.Histogram
	// GuestMemoryReadings counts the questions to source launchers about their guests' resident
	// RAM in migrations' first passes, by result: answered, or unanswered (that migration asks
	// no more).
	GuestMemoryReadings *prometheus.CounterVec
	// MigrationDowntime is how long migrations to this node stopped their guests, as the target
	// launchers report it from libvirt's statistics.
	MigrationDowntime prometheus.Histogram
	// VMsAtRisk is 1 while a VM on the node can be saved neither by the kubelet's eviction grace
	// nor by relief; EvictionGrace is that grace, LargestVMMigration the least time the node's
	// largest VM takes to migrate, and ReliefOn whether relief is on (pressure.Exposure).
	VMsAtRisk, EvictionGrace, LargestVMMigration, ReliefOn prometheus.Gauge
	// StrayGuestsDestroyed counts guests destroyed because the API server says their VM runs
	// elsewhere or not at all, by reason (agent.Stray*).
	StrayGuestsDestroyed *prometheus.CounterVec
	// ResumedOnArrival counts guests the agent ran after they arrived paused and their source's
	// hand-off did not run them (Decide's Resume).
	ResumedOnArrival prometheus.Counter
	// APIServerCutOff is 1 while the agent has not reached the API server for longer than
	// --api-server-lost-after; APIServerOutages counts such outages once they ended.
	APIServerCutOff  prometheus.Gauge
	APIServerOutages prometheus.Counter
	// guestDrops counts, by VM, the frames its guest sent that the filter in its pod dropped.
	guestDrops *guestFilterDrops
}

// exposure sets the gauges of what the kubelet's eviction settings mean for the node's VMs.
func (m *Metrics) exposure(e pressure.Exposure) {
	bit := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	m.VMsAtRisk.Set(bit(e.AtRisk))
	m.EvictionGrace.Set(e.Grace.Seconds())
	m.LargestVMMigration.Set(e.Migration.Seconds())
	m.ReliefOn.Set(bit(e.Relief))
}

// NewMetrics registers the agent's metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Launchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_launchers", Help: "Launchers whose libvirt daemon the agent is connected to.",
		}),
		SignalDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_graceful_shutdown_signals_total",
			Help: "SIGTERMs launchers received, by the agent's decision (evacuate or shutdown).",
		}, []string{"decision"}),
		MarkLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lifeboat_agent_mark_latency_seconds",
			Help:    "Time from a launcher's SIGTERM to the evacuation mark accepted by the API server.",
			Buckets: prometheus.ExponentialBuckets(0.002, 2, 12),
		}),
		EvacuationsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_evacuations_lost_total",
			Help: "VMs marked for evacuation that were still on the node when the kubelet's deadline passed.",
		}),
		LauncherRescans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_rescans_total",
			Help: "Rescans of the launcher directories after their watch failed or lost events (an inotify queue overflow).",
		}),
		LauncherDirsRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_dirs_removed_total",
			Help: "Per-VMI launcher directories removed because their VMI had no launcher pod left on the node.",
		}),
		PodNetworks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_pod_networks_total",
			Help: "Guests' sides of the pod network the agent built in launcher pods, by binding (masquerade, bridge; unknown when the VMI could not be read) and result (built, failed).",
		}, []string{"binding", "result"}),
		SourceForwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_source_forwards_total",
			Help: "Migration source pods on the pod network made to forward what still reaches them to the target pod once the guest left, until no EndpointSlice lists them, by result (started; skipped: no namespace held or no target address; failed).",
		}, []string{"result"}),
		LauncherImpostors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_impostors_total",
			Help: "Pods on this node labelled as a VMI's launcher that are not the launcher pod lifeboat's controller recorded for it (in the VMI's or its migration's status): the agent linked nothing of the VM to them. Each pod counts once.",
		}),
		LibvirtCallsAbandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_libvirt_calls_abandoned_total",
			Help: "Calls to a launcher's libvirt the agent stopped waiting for at their deadline, by call; each cut that launcher's connection.",
		}, []string{"call"}),
		LauncherLibvirtdRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_libvirtd_restarts_total",
			Help: "Times a launcher on this node found its libvirtd dead (killed or crashed) and started it again, as the launchers reported them; their guests ran on.",
		}),
		LibvirtdRestartReportsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_libvirtd_restart_reports_dropped_total",
			Help: "Reports of a libvirtd restart beyond the five in ten minutes a launcher makes before it gives up, dropped uncounted and unrecorded: a launcher that sends them is not lifeboat's.",
		}),
		LauncherConnectFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_connect_failures_total",
			Help: "Connections to a launcher's libvirt that failed or ended within 10 s of opening; the agent spaces out the next ones to that launcher (0.5 s doubling to 5 min), as each starts a libvirt client child.",
		}),
		LauncherReportsUnlogged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_launcher_reports_unlogged_total",
			Help: "Launchers' notify reports handled but not logged: each launcher's reports are logged at most 2 a second (bursts of 20), so that none floods the agent's log.",
		}),
		MigrationConnectionsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_migration_connections_refused_total",
			Help: "Connections to this node's migration target proxies refused at the TLS handshake: no certificate, another node's or CA's, or another migration's.",
		}),
		ReliefDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_node_pressure_relief_total",
			Help: "VMs node-pressure relief marked to move before the kubelet evicts (result marked), and decisions that could not free enough memory (result insufficient).",
		}, []string{"result"}),
		ReliefAvailable: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lifeboat_agent_node_pressure_relief_memory_available_bytes",
			Help:    "The node's memory.available when node-pressure relief decided to move VMs.",
			Buckets: prometheus.ExponentialBuckets(64<<20, 2, 10),
		}),
		ReliefLine: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_node_pressure_relief_line_bytes",
			Help: "The node's memory.available below which node-pressure relief moves VMs away: the kubelet's acting threshold plus spec.nodePressureRelief.margin (0 while relief is off or the kubelet has no memory threshold).",
		}),
		DirtyRateEstimates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_dirty_rate_estimates_total",
			Help: "Guests' dirty rates sampled by QEMU as their migrations from this node began, by result: measured, unavailable (the first pass over memory judged without one), or late (the first pass ended before the sample did).",
		}, []string{"result"}),
		DirtyRateEstimated: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lifeboat_agent_dirty_rate_estimate_bytes_per_second",
			Help:    "Guests' dirty rates as QEMU's page sampling measured them when their migrations from this node began.",
			Buckets: prometheus.ExponentialBuckets(1<<20, 2, 12),
		}),
		GuestMemoryReadings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_guest_memory_readings_total",
			Help: "Questions to source launchers, in migrations' first passes over memory, about how much of their guests' RAM is resident (what bounds the memory a guest has in use), by result: answered, or unanswered (the launcher is not asked again in that migration, which bounds it by QEMU's resident memory).",
		}, []string{"result"}),
		MigrationDowntime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lifeboat_agent_migration_downtime_seconds",
			Help:    "How long each migration to this node stopped its guest for the switch-over (libvirt's downtime, reported by the target launcher).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		VMsAtRisk: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_node_vms_at_risk",
			Help: "1 while a VM on the node can be saved neither by the kubelet's eviction grace (too short for its migration) nor by node-pressure relief (off), else 0.",
		}),
		EvictionGrace: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_node_eviction_grace_seconds",
			Help: "The grace the kubelet gives a VM pod it evicts for memory at the threshold that acts first (0: no memory threshold).",
		}),
		LargestVMMigration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_node_largest_vm_migration_seconds",
			Help: "The least time the node's largest live-migrating VM takes to migrate: its memory at bandwidthPerMigration (10 Gbit/s assumed without one), as if the guest wrote nothing.",
		}),
		ReliefOn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_node_pressure_relief_on",
			Help: "1 while node-pressure relief is on for the node (set so, or unset where the kubelet's grace is too short for a migration).",
		}),
		StrayGuestsDestroyed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lifeboat_agent_stray_guests_destroyed_total",
			Help: "Guests the agent destroyed because the API server, read live, says their VM runs elsewhere or not at all (a node that came back after its VMs were restarted elsewhere), by reason: VMIGone, VMIReplaced, VMIEnded, VMIElsewhere.",
		}, []string{"reason"}),
		ResumedOnArrival: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_guests_resumed_on_arrival_total",
			Help: "Guests the agent ran after a migration left them paused on this node and the source launcher's hand-off did not reach them (the link between the nodes broke as the source gave the guest up, or the source launcher was slower than the agent).",
		}),
		APIServerCutOff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lifeboat_agent_api_server_cut_off",
			Help: "1 while the agent has not reached the API server (or did not run) for longer than --api-server-lost-after; it pauses nothing and kills nothing meanwhile.",
		}),
		APIServerOutages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lifeboat_agent_api_server_outages_total",
			Help: "Times the agent was cut off from the API server (or did not run) for longer than --api-server-lost-after, counted when contact came back.",
		}),
		guestDrops: newGuestFilterDrops(),
	}
	reg.MustRegister(m.Launchers, m.SignalDecisions, m.MarkLatency, m.EvacuationsLost, m.LauncherRescans, m.LauncherDirsRemoved, m.LauncherImpostors, m.PodNetworks, m.SourceForwards, m.LibvirtCallsAbandoned, m.LauncherLibvirtdRestarts, m.LibvirtdRestartReportsDropped, m.LauncherConnectFailures, m.LauncherReportsUnlogged, m.MigrationConnectionsRefused,
		m.ReliefDecisions, m.ReliefAvailable, m.ReliefLine, m.DirtyRateEstimates, m.DirtyRateEstimated, m.GuestMemoryReadings, m.MigrationDowntime,
		m.VMsAtRisk, m.EvictionGrace, m.LargestVMMigration, m.ReliefOn, m.StrayGuestsDestroyed, m.ResumedOnArrival, m.APIServerCutOff, m.APIServerOutages, m.guestDrops)
	// Each decision is served from the start, at 0: no SIGTERM yet reads as 0, not as a series
	// that is missing, which a renamed metric would look like too.
	for _, d := range []string{DecisionEvacuate, DecisionShutdown} {
		m.SignalDecisions.WithLabelValues(d)
	}
	for _, r := range []string{guestMemoryAnswered, guestMemoryUnanswered} {
		m.GuestMemoryReadings.WithLabelValues(r)
	}
	return m
}
