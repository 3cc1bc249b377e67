package agent

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// TestEachArrivalsDowntimeIsCountedOnce: a target launcher's Migrated report puts the guest's
// downtime in the histogram once, though the launcher repeats it after a reconnection; the
// next migration of the same VM to this node counts again.
func TestEachArrivalsDowntimeIsCountedOnce(t *testing.T) {
	client := lifeboatfake.NewSimpleClientset()
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	metrics := NewMetrics(prometheus.NewRegistry())
	a, err := New(Config{NodeName: "node-a", Metrics: metrics, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	vmi := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "uid-vm"}
	first := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	migrated := func(at time.Time, downtime int64) {
		a.HandleNotify(&notify.Message{Kind: notify.KindMigrated, VMI: vmi, Time: at, DowntimeMilliseconds: downtime}, 1)
	}
	migrated(first, 40)
	migrated(first, 40) // replayed on a new connection
	migrated(first.Add(time.Hour), 250)

	m := &dto.Metric{}
	if err := metrics.MigrationDowntime.Write(m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got != 2 {
		t.Errorf("%d downtimes counted, want 2 (one per arrival)", got)
	}
	if got := m.GetHistogram().GetSampleSum(); got != 0.29 {
		t.Errorf("downtimes sum to %vs, want 0.29s", got)
	}
	if n := testutil.CollectAndCount(metrics.MigrationDowntime); n != 1 {
		t.Errorf("%d histogram series, want 1", n)
	}
}
