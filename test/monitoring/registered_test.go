// Package monitoring tests manifests/monitoring: the alerts and the dashboard name only metrics
// lifeboat's components register, with the labels they carry, and the alerts fire when they
// should.
package monitoring

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/nodecert"
	"github.com/lifeboat-vm/lifeboat/agent/notifyserver"
	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/kube"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/evacuation/cancellation"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/evacuation/nodecerts"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// TestMain quiets client-go's certificate manager, which logs through klog how its requests to
// the fake API server go unanswered.
func TestMain(m *testing.M) {
	klog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// metric is what a query may rely on of a registered metric: its label names, and whether it
// is a histogram (whose series are name_bucket, name_sum and name_count).
type metric struct {
	labels    map[string]bool
	histogram bool
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// registered builds each component's metrics as its binary does, on fake clients, and returns
// them by name: every metric lifeboat-agent and lifeboat-controller serve, but the Go runtime's
// and the process's, and the agent's device plugin registrations (counted in its main package).
func registered(t *testing.T) map[string]metric {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg := &recordingRegistry{Registry: prometheus.NewRegistry(), descs: map[string]string{}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	kubeClient, lb := kubefake.NewClientset(), lifeboatfake.NewSimpleClientset()
	recorder := record.NewFakeRecorder(100)

	// lifeboat-agent (cmd/lifeboat-agent).
	reg.MustRegister(kube.RequestsMetric)
	if _, err := nodecert.Start(ctx, kubeClient, "node-a", t.TempDir(), "lifeboat-system", reg); err != nil {
		t.Fatal(err)
	}
	// Both thresholds set, as on a kubelet with evictionSoft: each has its series.
	pressure.RegisterMetrics(reg, func() (pressure.Memory, error) { return pressure.Memory{Capacity: 16 << 30}, nil },
		pressure.Thresholds{Soft: pressure.Threshold{Bytes: 1 << 30}, Hard: pressure.Threshold{Bytes: 100 << 20}})
	notifyserver.New(nil, func(*notify.Message, int32) {}, reg, log)
	agent.NewMetrics(reg)

	// lifeboat-controller (cmd/lifeboat-controller), on a registry of its own as in its binary.
	controller := &recordingRegistry{Registry: prometheus.NewRegistry(), descs: reg.descs}
	controller.MustRegister(kube.RequestsMetric)
	kubeInformers := informers.NewSharedInformerFactory(kubeClient, 0)
	pods := kubeInformers.Core().V1().Pods()
	lbv1 := lifeboatinformers.NewSharedInformerFactory(lb, 0).Lifeboat().V1alpha1()
	nodes, _ := evacuate.NewCapacityInformers(kubeClient)
	migration.New(kubeClient, lb, lbv1.VirtualMachineInstanceMigrations(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), pods,
		disruption.NewBudgetInformer(kubeClient), nodes, migration.NewLeaseInformer(kubeClient), recorder, vmi.PodOptions{}, controller, log)
	cancellation.NewMetrics(controller)
	vm.New(lb, lbv1.VirtualMachines(), lbv1.VirtualMachineInstances(), pods, recorder, controller, log)
	ca, err := nodecerts.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	nodecerts.New(kubeClient, ca, "system:serviceaccount:lifeboat-system:lifeboat-agent", nodecerts.NewInformer(kubeClient).Certificates().V1().CertificateSigningRequests(), recorder, time.Hour, controller, log)
	if _, err := webhook.New(kubeClient, lb, pods, lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), nodes, recorder,
		webhook.Options{Endpoint: webhook.Endpoint{URL: "https://127.0.0.1:8443" + webhook.Path}, CertValidity: time.Hour, ClientAuth: webhook.ClientAuthAuto},
		controller, log); err != nil {
		t.Fatal(err)
	}
	responder.NewMetrics(controller)

	metrics := map[string]metric{}
	for name, desc := range reg.descs {
		labels, err := labelNames(desc)
		if err != nil {
			t.Fatal(err)
		}
		metrics[name] = metric{labels: labels}
	}
	// Histograms without labels are gathered at once; lifeboat has no histogram with labels.
	for _, r := range []*recordingRegistry{reg, controller} {
		families, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if m, ok := metrics[f.GetName()]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
				m.histogram = true
				metrics[f.GetName()] = m
			}
		}
	}
	return metrics
}

// recordingRegistry registers like the binaries' registries and keeps each metric's description.
type recordingRegistry struct {
	*prometheus.Registry
	descs map[string]string // by metric name: prometheus.Desc.String()
}

var descName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

func (r *recordingRegistry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		s := d.String()
		if m := descName.FindStringSubmatch(s); m != nil {
			r.descs[m[1]] = s
		}
	}
	return nil
}

func (r *recordingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// descLabels takes the label names out of a prometheus.Desc's String, the only place the
// client library shows them before a series exists.
var descLabels = regexp.MustCompile(`constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

func labelNames(desc string) (map[string]bool, error) {
	m := descLabels.FindStringSubmatch(desc)
	if m == nil {
		return nil, fmt.Errorf("no labels in %s", desc)
	}
	names := map[string]bool{}
	for _, l := range targetLabels {
		names[l] = true
	}
	for _, pair := range strings.Split(m[1], ",") {
		if name, _, ok := strings.Cut(pair, "="); ok {
			names[name] = true
		}
	}
	for _, name := range strings.Split(m[2], ",") {
		if name != "" {
			names[name] = true
		}
	}
	return names, nil
}
