package agent

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestTheAgentPublishesWhatTheKubeletsSettingsMean: on a kubelet with the upstream defaults and
// relief turned off, the node's largest LiveMigrate VM is at risk: the agent publishes it once
// (annotation, Warning Event, metric) however many rounds pass; once relief is left unset it
// comes on, and the agent says the VMs are no longer at risk.
func TestTheAgentPublishesWhatTheKubeletsSettingsMean(t *testing.T) {
	const gib = 1 << 30
	vm := func(name, memory string, s v1alpha1.EvictionStrategy) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
		v.Spec.Memory = resource.MustParse(memory)
		v.Spec.EvictionStrategy = ptr.To(s)
		v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, "node-a"
		return v
	}
	config := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
	config.Spec.FeatureGates = []v1alpha1.FeatureGate{v1alpha1.FeatureGateNodePressureEvictionLiveMigration}
	config.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("64Mi"))
	config.Spec.NodePressureRelief = &v1alpha1.NodePressureReliefConfig{Enabled: ptr.To(false)}
	// The None VM is larger, but no migration would save it: the 1Gi one is the largest that counts.
	client := lifeboatfake.NewSimpleClientset(config, vm("migrates", "1Gi", v1alpha1.EvictionStrategyLiveMigrate), vm("stays", "4Gi", v1alpha1.EvictionStrategyNone))
	recorder := record.NewFakeRecorder(100)
	metrics := NewMetrics(prometheus.NewRegistry())
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	var published []v1alpha1.NodeEvictionExposure
	settings := pressure.UpstreamKubeletSettings
	a, err := New(Config{
		NodeName: "node-a", Recorder: recorder, Metrics: metrics, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Configs:           informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(),
		Memory:            func() (pressure.Memory, error) { return pressure.Memory{Capacity: 16 * gib, WorkingSet: gib}, nil },
		Thresholds:        settings.Thresholds,
		MaxPodGracePeriod: &settings.MaxPodGracePeriod,
		KubeletSource:     KubeletSourceDefaults,
		PublishExposure: func(_ context.Context, e v1alpha1.NodeEvictionExposure) error {
			published = append(published, e)
			return nil
		},
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
	a.relieve(ctx)
	if len(published) != 1 {
		t.Fatalf("published %d times, want once: %+v", len(published), published)
	}
	want := v1alpha1.NodeEvictionExposure{Source: KubeletSourceDefaults, Threshold: "hard", GraceSeconds: 1, LargestVMBytes: gib, MigrationSeconds: 18, AtRisk: true}
	got := published[0]
	if msg := got.Message; !strings.Contains(msg, "could not be read") || !strings.Contains(msg, "does not fit") || !strings.Contains(msg, "relief is off") {
		t.Errorf("message %q: want it to say the defaults were assumed, the migration does not fit and relief is off", msg)
	}
	got.Message = ""
	if got != want {
		t.Errorf("published %+v, want %+v", got, want)
	}
	if e := <-recorder.Events; !strings.HasPrefix(e, "Warning "+ReasonVMsAtRisk) {
		t.Errorf("Event %q, want Warning %s", e, ReasonVMsAtRisk)
	}
	if got := testutil.ToFloat64(metrics.VMsAtRisk); got != 1 {
		t.Errorf("lifeboat_agent_node_vms_at_risk = %v, want 1", got)
	}

	config = config.DeepCopy()
	config.Spec.NodePressureRelief = nil
	if err := informers.Lifeboat().V1alpha1().LifeboatConfigs().Informer().GetStore().Update(config); err != nil {
		t.Fatal(err)
	}
	a.relieve(ctx)
	if len(published) != 2 || published[1].AtRisk || !published[1].Relief {
		t.Fatalf("after relief was left unset, published %+v; want relief on and nothing at risk", published)
	}
	if e := <-recorder.Events; !strings.HasPrefix(e, "Normal "+ReasonVMsNoLongerAtRisk) {
		t.Errorf("Event %q, want Normal %s", e, ReasonVMsNoLongerAtRisk)
	}
	if got, relief := testutil.ToFloat64(metrics.VMsAtRisk), testutil.ToFloat64(metrics.ReliefOn); got != 0 || relief != 1 {
		t.Errorf("lifeboat_agent_node_vms_at_risk = %v, lifeboat_agent_node_pressure_relief_on = %v; want 0 and 1", got, relief)
	}
}
