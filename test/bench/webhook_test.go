package bench

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lbkube "github.com/lifeboat-vm/lifeboat/api/kube"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// BenchmarkWebhookEvictions sends 100 concurrent evictions of LiveMigrate VMs' launcher pods through
// the real kube-apiserver to the eviction webhook, which marks each VM (a status write and an
// Event) and answers 429; beside them, in the same run, 100 concurrent evictions of ordinary pods,
// which the webhook lets through and the API server carries out. It reports each side's p50 and p99
// as the evictor sees them, and the ratio of the p99s.
func BenchmarkWebhookEvictions(b *testing.B) {
	const n = 100
	ctx, cp := startControlPlane(b)
	// The evictor sends as fast as it likes; the webhook's clients have lifeboat-controller's limits.
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 1000, 1000
	kube := kubernetes.NewForConfigOrDie(cfg)
	lb := lifeboatclient.NewForConfigOrDie(cfg)
	hookCfg := rest.CopyConfig(cp.Config)
	hookCfg.QPS, hookCfg.Burst = lbkube.ClientQPS, lbkube.ClientBurst
	startWebhook(ctx, b, kubernetes.NewForConfigOrDie(hookCfg), lifeboatclient.NewForConfigOrDie(hookCfg), cp.CAFile())

	for i := 0; b.Loop(); i++ {
		ns := fmt.Sprintf("bench-%d", i)
		vmPods, plainPods := populate(ctx, b, kube, lb, ns, n)
		vm := evictAll(ctx, b, kube, vmPods, func(err error) error {
			if s := (apierrors.APIStatus)(nil); !errors.As(err, &s) || s.Status().Code != 429 || !strings.Contains(s.Status().Message, webhook.EvacuationText) {
				return fmt.Errorf("want 429 with %q, got %v", webhook.EvacuationText, err)
			}
			return nil
		})
		plain := evictAll(ctx, b, kube, plainPods, func(err error) error { return err })
		vmis, err := lb.LifeboatV1alpha1().VirtualMachineInstances(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for _, v := range vmis.Items {
			if !v.MarkedForEvacuation() {
				b.Fatalf("VMI %s was not marked", v.Name)
			}
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(quantile(vm, 0.50)), "vm-p50-ms")
		b.ReportMetric(ms(quantile(vm, 0.99)), "vm-p99-ms")
		b.ReportMetric(ms(quantile(plain, 0.50)), "pod-p50-ms")
		b.ReportMetric(ms(quantile(plain, 0.99)), "pod-p99-ms")
		b.ReportMetric(float64(quantile(vm, 0.99))/float64(quantile(plain, 0.99)), "p99-ratio")
	}
}

// startWebhook serves the webhook in this process on a free loopback port, registered by URL, and
// waits until the API server calls it.
func startWebhook(ctx context.Context, b *testing.B, kube kubernetes.Interface, lb lifeboatclient.Interface, clusterCA string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	kubeInformers := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	url := "https://" + addr + webhook.Path
	// The recorder lifeboat-controller uses: each mark's Event is written to the API server.
	recorder, stopRecorder, err := lbkube.Recorder(ctx, kube, "lifeboat-controller", "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stopRecorder)
	nodes := informers.NewSharedInformerFactory(kube, 0)
	hook, err := webhook.New(kube, lb, kubeInformers.Core().V1().Pods(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), nodes.Core().V1().Nodes().Informer(),
		recorder, webhook.Options{Listen: addr, Endpoint: webhook.Endpoint{URL: url}, CertValidity: time.Hour,
			ClientCAs: caPool(b, clusterCA), ClientNames: []string{controlplane.WebhookClientName}, ClientAuth: webhook.ClientAuthStrict},
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())
	nodes.Start(ctx.Done())
	go func() {
		if err := hook.Run(ctx); err != nil {
			b.Error(err)
		}
	}()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{})
		return err == nil && len(c.Webhooks) == 1 && c.Webhooks[0].ClientConfig.URL != nil && *c.Webhooks[0].ClientConfig.URL == url, nil
	})
	if err != nil {
		b.Fatal("the webhook did not register within 30s")
	}
}

// populate makes a namespace with n running LiveMigrate VMIs and their launcher pods, and n ordinary pods.
func populate(ctx context.Context, b *testing.B, kube kubernetes.Interface, lb lifeboatclient.Interface, ns string, n int) (vmPods, plainPods []*corev1.Pod) {
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// No controller manager makes it; the pods refer to it.
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	pod := func(name string, labels map[string]string, owners ...metav1.OwnerReference) *corev1.Pod {
		p, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, OwnerReferences: owners},
			Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	for i := range n {
		v, err := lb.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, &v1alpha1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vm-%d", i)},
			Spec: v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse("128Mi"), Boot: v1alpha1.BootSource{Kernel: "/k"},
				EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate)},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, node
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable", LastTransitionTime: metav1.Now()}}
		if _, err := lb.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		vmPods = append(vmPods, pod("launcher-"+v.Name, map[string]string{
			v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIName: v.Name, v1alpha1.LabelVMIUID: string(v.UID)},
			// A launcher's controller is its VMI, as evacuation/vmi makes it.
			*metav1.NewControllerRef(v, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))))
		plainPods = append(plainPods, pod(fmt.Sprintf("plain-%d", i), nil))
	}
	// The webhook decides from its caches: wait until they hold what was just made.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: vmPods[n-1].Name, Namespace: ns}, DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}}
		last = kube.CoreV1().Pods(ns).EvictV1(ctx, ev)
		return last != nil && strings.Contains(last.Error(), webhook.EvacuationText), nil
	})
	if err != nil {
		b.Fatalf("a dry-run eviction of the last VM's pod: %v, want the webhook's %q", last, webhook.EvacuationText)
	}
	return vmPods, plainPods
}

// evictAll evicts the pods all at once and returns each eviction's round trip; check judges each answer.
func evictAll(ctx context.Context, b *testing.B, kube kubernetes.Interface, pods []*corev1.Pod, check func(error) error) []time.Duration {
	took := make([]time.Duration, len(pods))
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range pods {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			err := kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			took[i] = time.Since(t0)
			errs[i] = check(err)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return took
}

// caPool is the CA certificates in the PEM file path.
func caPool(b *testing.B, path string) *x509.CertPool {
	pem, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		b.Fatalf("no certificate in %s", path)
	}
	return pool
}
