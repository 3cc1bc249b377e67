package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// TestEachArrivalsDowntimeIsCountedOnce: a target launcher's Migrated report puts the guest's
// downtime in the histogram once, though the launcher repeats it after a reconnection; the
// next migration of the same VM to this node counts again.
func TestEachArrivalsDowntimeIsCountedOnce(t *testing.T) {
	a := newFakeAgent(t, Config{})
	metrics := a.metrics
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

// TestTheTargetRecordsTheDowntimeOnTheVMI: the target agent writes the reported downtime on the
// VMI's migration state, for kubectl lifeboat follow to read, once: a replayed report keeps the
// figure, and a report from before the migration started, or for a failed migration or one to
// another node, writes nothing.
func TestTheTargetRecordsTheDowntimeOnTheVMI(t *testing.T) {
	start := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	vmi := func(name string, change func(*v1alpha1.VirtualMachineInstanceMigrationState)) *v1alpha1.VirtualMachineInstance {
		s := &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "mig-" + name, SourceNode: "node-b", TargetNode: "node-a",
			StartTimestamp: &metav1.Time{Time: start}, Completed: true}
		if change != nil {
			change(s)
		}
		return &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: "node-a", MigrationState: s}}
	}
	client := lifeboatfake.NewSimpleClientset(
		vmi("arrived", nil),
		vmi("failed", func(s *v1alpha1.VirtualMachineInstanceMigrationState) { s.Completed, s.Failed = false, true }),
		vmi("elsewhere", func(s *v1alpha1.VirtualMachineInstanceMigrationState) { s.TargetNode = "node-c" }),
		vmi("later", nil),
	)
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	a, err := New(Config{NodeName: "node-a", Metrics: NewMetrics(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	report := func(name string, at time.Time, downtime time.Duration) {
		a.migrations.recordDowntime(notify.VMIRef{Namespace: "ns", Name: name, UID: "uid-" + name}, at, downtime)
	}
	report("arrived", start.Add(3*time.Second), 42*time.Millisecond)
	report("arrived", start.Add(3*time.Second), 99*time.Millisecond) // a replay, or a confused launcher: the first stays
	report("failed", start.Add(3*time.Second), 42*time.Millisecond)
	report("elsewhere", start.Add(3*time.Second), 42*time.Millisecond)
	report("later", start.Add(-time.Hour), 42*time.Millisecond) // the report of an earlier arrival
	for name, want := range map[string]*int64{"arrived": ptr.To[int64](42), "failed": nil, "elsewhere": nil, "later": nil} {
		v, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := v.Status.MigrationState.DowntimeMilliseconds; (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Errorf("VMI %s: downtimeMilliseconds %v, want %v", name, ptrString(got), ptrString(want))
		}
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
