package agent

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
)

// fakeAgent is an agent on a fake lifeboat clientset, with what a test reads of it.
type fakeAgent struct {
	*Agent
	client    *lifeboatfake.Clientset
	informers lifeboatinformers.SharedInformerFactory
	metrics   *Metrics
	recorder  *record.FakeRecorder
}

// newFakeAgent makes an agent from cfg on a fake lifeboat clientset. What cfg leaves unset it
// gets: the node "node-a", metrics on a registry of their own, a fake recorder of 100 Events,
// a discarded log, and the informers' LifeboatConfig lister. Its informers are not started.
func newFakeAgent(t *testing.T, cfg Config) *fakeAgent {
	t.Helper()
	f := &fakeAgent{client: lifeboatfake.NewSimpleClientset()}
	f.informers = lifeboatinformers.NewSharedInformerFactory(f.client, 0)
	if cfg.NodeName == "" {
		cfg.NodeName = "node-a"
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	f.metrics = cfg.Metrics
	if cfg.Recorder == nil {
		f.recorder = record.NewFakeRecorder(100)
		cfg.Recorder = f.recorder
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	lb := f.informers.Lifeboat().V1alpha1()
	if cfg.Configs == nil {
		cfg.Configs = lb.LifeboatConfigs().Lister()
	}
	a, err := New(cfg, f.client, lb.VirtualMachineInstances(), lb.LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{lb.VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	f.Agent = a
	return f
}
