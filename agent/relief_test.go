package agent

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestReliefMarksTheVMsTheKubeletWouldEvictFirst: with relief on and memory.available within the
// margin of the soft threshold, the agent marks the movable VM with the most memory (cause
// NodePressureRelief), with an Event on the VMI and on the Node and a metric; a VM that cannot
// migrate and one whose strategy is None stay. With relief off, nothing is marked.
func TestReliefMarksTheVMsTheKubeletWouldEvictFirst(t *testing.T) {
	const gib = 1 << 30
	vm := func(name, memory string, strategy v1alpha1.EvictionStrategy, migratable bool) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
		v.Spec.Memory = resource.MustParse(memory)
		v.Spec.EvictionStrategy = ptr.To(strategy)
		v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, "node-a"
		status := metav1.ConditionTrue
		if !migratable {
			status = metav1.ConditionFalse
		}
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: status, Reason: "Test", LastTransitionTime: metav1.Now()}}
		return v
	}
	for _, tc := range []struct {
		name       string
		enabled    bool
		wantMarked []string
		wantLabels []bool // the node label's changes
		wantLine   float64
	}{
		{"relief on: the largest movable VM, and the node labelled", true, []string{"big"}, []bool{true}, gib + 512<<20},
		{"relief off: nothing, and a label from before removed", false, nil, []bool{false}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
			config.Spec.NodePressureRelief = &v1alpha1.NodePressureReliefConfig{Enabled: ptr.To(tc.enabled), Margin: ptr.To(resource.MustParse("512Mi"))}
			client := lifeboatfake.NewSimpleClientset(config,
				vm("big", "2Gi", v1alpha1.EvictionStrategyLiveMigrate, true),
				vm("small", "256Mi", v1alpha1.EvictionStrategyLiveMigrate, true),
				vm("pinned", "4Gi", v1alpha1.EvictionStrategyLiveMigrate, false),
				vm("none", "4Gi", v1alpha1.EvictionStrategyNone, true))
			recorder := record.NewFakeRecorder(100)
			metrics := NewMetrics(prometheus.NewRegistry())
			informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
			// 1.3 GiB available: 200 MiB short of the soft threshold (1 GiB) plus the margin.
			mem := pressure.Memory{Capacity: 16 * gib, WorkingSet: 16*gib - 1331<<20}
			var labels []bool
			a, err := New(Config{
				NodeName: "node-a", Recorder: recorder, Metrics: metrics, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Configs:       informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(),
				Memory:        func() (pressure.Memory, error) { return mem, nil },
				Thresholds:    pressure.Thresholds{Soft: pressure.Threshold{Bytes: gib}},
				PodWorkingSet: func(string) (uint64, bool) { return 0, false },
				LabelNode:     func(_ context.Context, on bool) error { labels = append(labels, on); return nil },
			}, client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
				[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			informers.Start(ctx.Done())
			informers.WaitForCacheSync(ctx.Done())

			a.relieve(ctx)
			// A second round, once the agent's cache has the marks, changes nothing: a marked VM is
			// still moving (relief waits for it) and the label is set.
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
				marked := 0
				for _, obj := range a.informer.GetStore().List() {
					if obj.(*v1alpha1.VirtualMachineInstance).MarkedForEvacuation() {
						marked++
					}
				}
				return marked == len(tc.wantMarked), nil
			}); err != nil {
				t.Fatalf("the agent's cache never showed %d marked VMs", len(tc.wantMarked))
			}
			a.relieve(ctx)
			if !slices.Equal(labels, tc.wantLabels) {
				t.Errorf("node label changes %v, want %v", labels, tc.wantLabels)
			}

			list, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var marked []string
			for _, v := range list.Items {
				if v.MarkedForEvacuation() {
					marked = append(marked, v.Name)
					if v.EvacuationCause() != string(v1alpha1.MigrationCauseNodePressureRelief) || v.Status.EvacuationDeadline != nil {
						t.Errorf("VMI %s marked with cause %q and deadline %v; want NodePressureRelief and none", v.Name, v.EvacuationCause(), v.Status.EvacuationDeadline)
					}
				}
			}
			if !slices.Equal(marked, tc.wantMarked) {
				t.Errorf("marked %v, want %v", marked, tc.wantMarked)
			}
			var events []string
			for len(recorder.Events) > 0 {
				events = append(events, <-recorder.Events)
			}
			wantEvents := 0
			if tc.enabled {
				wantEvents = 2 // the Node's and the VMI's
			}
			relief := slices.DeleteFunc(slices.Clone(events), func(e string) bool { return !strings.Contains(e, "NodePressureRelief") })
			if len(relief) != wantEvents {
				t.Errorf("Events %q: want %d NodePressureRelief Events", events, wantEvents)
			}
			if got := testutil.ToFloat64(metrics.ReliefDecisions.WithLabelValues("marked")); got != float64(len(tc.wantMarked)) {
				t.Errorf("lifeboat_agent_node_pressure_relief_total{result=marked} = %v, want %d", got, len(tc.wantMarked))
			}
			if got := testutil.ToFloat64(metrics.ReliefLine); got != tc.wantLine {
				t.Errorf("lifeboat_agent_node_pressure_relief_line_bytes = %v, want %v (the soft threshold plus the margin, 0 with relief off)", got, tc.wantLine)
			}
		})
	}
}
