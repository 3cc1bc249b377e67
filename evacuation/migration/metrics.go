package migration

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Every replica keeps the migrations' cache, so each reports these, the leader or not: a
// dashboard takes the max over replicas.
var (
	migrationsDesc = prometheus.NewDesc("lifeboat_migrations",
		"Migrations that exist, by cause and phase (Succeeded and Failed ones until they are deleted).",
		[]string{"cause", "phase"}, nil)
	deadlineDesc = prometheus.NewDesc("lifeboat_migration_deadline_timestamp_seconds",
		"When each migration that has not ended must have moved its guest off its source node (Unix time); migrations without a deadline are not listed.",
		[]string{"namespace", "migration", "vmi", "cause", "source_node"}, nil)
	waitingDesc = prometheus.NewDesc("lifeboat_migrations_waiting_for_slot",
		"Evacuation migrations made ahead of a free parallel-migration slot that wait for one, by source node: their targets are prepared, their memory not moving yet.",
		[]string{"source_node"}, nil)
)

// cacheCollector reads the migrations from the controller's cache at each scrape, so the
// figures are those of the API objects and no code path that moves a phase must remember them.
type cacheCollector struct {
	migrations lifeboatlisters.VirtualMachineInstanceMigrationLister
}

func (c cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- migrationsDesc
	ch <- deadlineDesc
	ch <- waitingDesc
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	list, err := c.migrations.List(labels.Everything())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(migrationsDesc, err)
		return
	}
	type key struct{ cause, phase string }
	counts := map[key]int{}
	waiting := map[string]int{}
	for _, m := range list {
		counts[key{string(m.Status.Cause), string(m.Status.Phase)}]++
		// A follower its source agent started is Running until the controller clears its wait.
		if m.WaitingForSlot() && !m.Status.Phase.Terminal() && m.Status.Phase != v1alpha1.MigrationRunning {
			waiting[m.Status.SourceNode]++
		}
		if m.Status.Deadline != nil && !m.Status.Phase.Terminal() {
			ch <- prometheus.MustNewConstMetric(deadlineDesc, prometheus.GaugeValue, float64(m.Status.Deadline.Unix()),
				m.Namespace, m.Name, m.Spec.VMIName, string(m.Status.Cause), m.Status.SourceNode)
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(migrationsDesc, prometheus.GaugeValue, float64(n), k.cause, k.phase)
	}
	for node, n := range waiting {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(n), node)
	}
}

// countEnded counts migrations as the cache sees them end, whoever wrote the phase (the source
// agent or this controller): finished migrations may be deleted before a scrape sees them.
func countEnded(ended *prometheus.CounterVec) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
		before, ok1 := oldObj.(*v1alpha1.VirtualMachineInstanceMigration)
		after, ok2 := newObj.(*v1alpha1.VirtualMachineInstanceMigration)
		if ok1 && ok2 && !before.Status.Phase.Terminal() && after.Status.Phase.Terminal() {
			ended.WithLabelValues(string(after.Status.Cause), string(after.Status.Phase)).Inc()
		}
	}}
}

// registerMetrics registers the migrations' figures, read from the informer's cache.
func registerMetrics(reg prometheus.Registerer, migrations cache.SharedIndexInformer) {
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lifeboat_migrations_ended_total",
		Help: "Migrations seen to end, by cause and phase (Succeeded, Failed).",
	}, []string{"cause", "phase"})
	// Present from the start, so that an alert on their increase sees the first end.
	for _, cause := range []v1alpha1.MigrationCause{v1alpha1.MigrationCauseNodePressure, v1alpha1.MigrationCauseNodePressureRelief,
		v1alpha1.MigrationCauseAPIEviction, v1alpha1.MigrationCauseEvictionRequest, v1alpha1.MigrationCauseDrain,
		v1alpha1.MigrationCausePodDeleted, v1alpha1.MigrationCauseManual} {
		for _, phase := range []v1alpha1.VirtualMachineInstanceMigrationPhase{v1alpha1.MigrationSucceeded, v1alpha1.MigrationFailed} {
			ended.WithLabelValues(string(cause), string(phase))
		}
	}
	reg.MustRegister(ended, cacheCollector{migrations: lifeboatlisters.NewVirtualMachineInstanceMigrationLister(migrations.GetIndexer())})
	_, _ = migrations.AddEventHandler(countEnded(ended))
}

var noTargetDesc = prometheus.NewDesc("lifeboat_vmis_no_target_node",
	"Running VMIs that no node other than their own could take (LiveMigratable False, reason NoTargetNode), by node: they cannot live-migrate, and a drain of the node waits for them (LiveMigrate) or shuts them down (LiveMigrateIfPossible).",
	[]string{"node"}, nil)

// noTargetCollector counts, at each scrape, the VMIs whose LiveMigratable condition says that no
// other node could take them, from the VMIs' cache.
type noTargetCollector struct {
	vmis lifeboatlisters.VirtualMachineInstanceLister
}

func (c noTargetCollector) Describe(ch chan<- *prometheus.Desc) { ch <- noTargetDesc }

func (c noTargetCollector) Collect(ch chan<- prometheus.Metric) {
	list, err := c.vmis.List(labels.Everything())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(noTargetDesc, err)
		return
	}
	counts := map[string]int{}
	for _, v := range list {
		if cond := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); v.Status.Phase == v1alpha1.VMIRunning &&
			cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == v1alpha1.VMIReasonNoTargetNode {
			counts[v.Status.NodeName]++
		}
	}
	for node, n := range counts {
		ch <- prometheus.MustNewConstMetric(noTargetDesc, prometheus.GaugeValue, float64(n), node)
	}
}
