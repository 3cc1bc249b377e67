// Command lifeboat-controller runs lifeboat's cluster-side controllers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/identity"
	"github.com/lifeboat-vm/lifeboat/api/kube"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/evacuation/atrisk"
	"github.com/lifeboat-vm/lifeboat/evacuation/cancellation"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/evacuation/nodecerts"
	"github.com/lifeboat-vm/lifeboat/evacuation/readiness"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

type options struct {
	podOpts       vmi.PodOptions
	workers       int
	metricsListen string
	// metricsInsecure serves metrics over plain HTTP without authentication (loopback only).
	metricsInsecure bool
	heartbeat       responder.Settings
	hook            webhookFlags
	leader          election
	// namespace keeps the migration CA; node certificates live at most nodeCertValidity, and
	// go to agentAccount's tokens (in namespace) for their own node.
	namespace        string
	nodeCertValidity time.Duration
	agentAccount     string
	// policyUser is the username the admission policies hold the controller to (identity.Check).
	policyUser string
	// run is what this process runs: runEverything, runControllers or runSigner.
	run string
}

// What a process runs (--run). The manifests run the signer of node certificates apart, under a
// service account of its own, so that only it may read the migration CA's key: the controllers'
// and the webhook's identity, which creates pods in every namespace, never holds it.
const (
	runEverything  = "all"
	runControllers = "controllers"
	runSigner      = "signer"
)

func main() {
	var o options
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	flag.StringVar(&o.podOpts.Image, "launcher-image", "lifeboat.dev/lifeboat-launcher:dev", "image of launcher pods")
	flag.StringVar(&o.podOpts.Acceleration, "acceleration", "auto", "guest acceleration launchers use: kvm, tcg, or auto (KVM only if a probe boot proves it works)")
	flag.IntVar(&o.workers, "workers", 4, "workers per controller")
	flag.StringVar(&o.metricsListen, "metrics-listen", "", `address to serve Prometheus metrics on (/metrics, HTTPS, to callers allowed to get /metrics), e.g. ":8080"; empty: none`)
	flag.BoolVar(&o.metricsInsecure, "metrics-insecure", false, "serve metrics over plain HTTP without authentication; only with a loopback --metrics-listen")
	heartbeat := flag.Duration("eviction-heartbeat-interval", time.Minute,
		"how often the EvictionRequest responder reports progress on an Eviction when nothing changes (20s to 3m)")
	o.hook.register()
	flag.StringVar(&o.namespace, "namespace", "lifeboat-system", "lifeboat's namespace, where the migration CA is kept (Secret "+nodecerts.CASecret+") and published (ConfigMap "+migrationtls.CAConfigMap+")")
	flag.DurationVar(&o.nodeCertValidity, "node-cert-validity", 24*time.Hour, "longest life of a node's migration certificate; agents renew theirs at 70 to 90% of it")
	flag.StringVar(&o.policyUser, "policy-user", identity.Controller,
		"the user lifeboat's admission policies (manifests/) hold the controller to; running as another service account, which they would not hold, it refuses to start. Empty: no check")
	flag.StringVar(&o.agentAccount, "agent-service-account", "lifeboat-agent", "the agents' service account, in --namespace: only its tokens bound to a node get that node's migration certificate")
	flag.StringVar(&o.run, "run", runEverything, "what to run: "+runEverything+" (the controllers, the webhook and the signer of node certificates, one identity), "+
		runControllers+" (all but the signer), or "+runSigner+" (the signer alone, which reads the migration CA's key; it leads on the Lease lifeboat-signer and skips the --policy-user check, as no policy names it)")
	o.leader.addFlags(flag.CommandLine)
	flag.Parse()
	o.heartbeat = responder.Settings{Min: responder.MinHeartbeatInterval, Max: *heartbeat}

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*kubeconfig, o, log); err != nil {
		log.Error("lifeboat-controller failed", "err", err)
		os.Exit(1)
	}
}

func run(kubeconfig string, o options, log *slog.Logger) error {
	podOpts, workers := o.podOpts, o.workers
	switch o.run {
	case runEverything, runControllers, runSigner:
	default:
		return fmt.Errorf("--run=%q: want %s, %s or %s", o.run, runEverything, runControllers, runSigner)
	}
	if o.nodeCertValidity < time.Minute {
		return fmt.Errorf("--node-cert-validity=%s: want at least a minute", o.nodeCertValidity)
	}
	switch podOpts.Acceleration {
	case "kvm", "tcg", "auto":
	default:
		return fmt.Errorf("--acceleration=%q: want kvm, tcg or auto", podOpts.Acceleration)
	}
	if err := checkMetricsListen(o.metricsListen, o.metricsInsecure); err != nil {
		return err
	}
	if err := o.heartbeat.Validate(); err != nil {
		return fmt.Errorf("--eviction-heartbeat-interval: %w", err)
	}
	hookOpts, err := o.hook.options()
	if err != nil {
		return err
	}
	kubeClient, lb, err := kube.Clients(kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if o.run == runSigner {
		return runSignerAlone(ctx, kubeClient, o, log)
	}
	if err := identity.Check(ctx, kubeClient, o.policyUser); err != nil {
		return err
	}
	recorder, stopRecorder, err := kube.Recorder(ctx, kubeClient, "lifeboat-controller", "")
	if err != nil {
		return err
	}
	defer stopRecorder()

	// Launcher pods name lifeboat as their EvictionRequest responder only where the API exists.
	if podOpts.EvictionResponder, err = responder.Served(kubeClient.Discovery()); err != nil {
		return err
	}
	log.Info("EvictionRequest API", "served", podOpts.EvictionResponder)

	kubeInformers := informers.NewSharedInformerFactoryWithOptions(kubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	pods := kubeInformers.Core().V1().Pods()
	claimInformers := informers.NewSharedInformerFactory(kubeClient, 0)
	nodes, boundPods := evacuate.NewCapacityInformers(kubeClient)
	vmiController := vmi.New(kubeClient, lb, lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), pods,
		claimInformers.Core().V1().PersistentVolumeClaims(), nodes, recorder, podOpts, log)
	mountFailures := vmi.NewMountFailureInformers(kubeClient)
	vmiController.RelayMountFailures(mountFailures.Core().V1().Events())
	evacuationController := evacuate.New(lb, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(), nodes, boundPods, recorder, log)
	budgets := disruption.NewBudgetInformer(kubeClient)
	disruptionController := disruption.New(kubeClient, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(), pods, budgets, recorder, log)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), kube.RequestsMetric)
	leases := migration.NewLeaseInformer(kubeClient)
	migrationController := migration.New(kubeClient, lb, lbv1.VirtualMachineInstanceMigrations(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), pods, budgets, nodes, leases, recorder, podOpts, reg, log)
	cancelController := cancellation.New(lb, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), recorder, cancellation.NewMetrics(reg), log)
	vmController := vm.New(lb, lbv1.VirtualMachines(), lbv1.VirtualMachineInstances(), pods, recorder, reg, log)
	// The controllers run in the leader only; every replica serves the webhook and metrics.
	controllers := []func(context.Context) error{
		func(ctx context.Context) error { return vmiController.Run(ctx, workers) },
		evacuationController.Run,
		func(ctx context.Context) error { return migrationController.Run(ctx, workers) },
		func(ctx context.Context) error { return disruptionController.Run(ctx, workers) },
		cancelController.Run,
		func(ctx context.Context) error { return vmController.Run(ctx, workers) },
		atrisk.New(lb, nodes, lbv1.LifeboatConfigs(), log).Run,
	}
	if o.run == runEverything {
		signer, csrInformers, err := newSigner(ctx, kubeClient, o, recorder, reg, log)
		if err != nil {
			return err
		}
		csrInformers.Start(ctx.Done())
		controllers = append(controllers, signer)
	}
	// The Ready condition names the replica as the Lease does.
	identity, err := o.leader.id()
	if err != nil {
		return err
	}
	controllers = append(controllers, readiness.New(kubeClient, lb, lbv1.LifeboatConfigs(), identity, hookOpts.Listen != "", log).Run)
	var always []func(context.Context) error
	if hookOpts.Listen != "" {
		hookServer, err := webhook.New(kubeClient, lb, pods, lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), nodes, recorder, hookOpts, reg, log)
		if err != nil {
			return err
		}
		always = append(always, hookServer.Run)
		// One writer of the mode's condition, so that replicas of different flags agree.
		controllers = append(controllers, hookServer.ReportMode)
	}
	if podOpts.EvictionResponder {
		evInformers := informers.NewSharedInformerFactoryWithOptions(kubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = responder.EvictionSelector
		}))
		r, err := responder.New(kubeClient, lb, responder.Informers{
			Evictions: evInformers.Lifecycle().V1alpha1().Evictions(), Pods: pods,
			VMIs: lbv1.VirtualMachineInstances(), Migrations: lbv1.VirtualMachineInstanceMigrations(), Configs: lbv1.LifeboatConfigs(),
		}, recorder, responder.NewMetrics(reg), o.heartbeat, log)
		if err != nil {
			return err
		}
		evInformers.Start(ctx.Done())
		controllers = append(controllers, func(ctx context.Context) error { return r.Run(ctx, workers) })
	}
	if o.metricsListen != "" {
		always = append(always, func(ctx context.Context) error {
			return serveMetrics(ctx, o.metricsListen, o.metricsInsecure, reg, kubeClient, log)
		})
	}
	kubeInformers.Start(ctx.Done())
	claimInformers.Start(ctx.Done())
	mountFailures.Start(ctx.Done())
	lbInformers.Start(ctx.Done())
	go budgets.RunWithContext(ctx)
	go nodes.RunWithContext(ctx)
	go leases.RunWithContext(ctx)
	go boundPods.RunWithContext(ctx)

	always = append(always, func(ctx context.Context) error {
		return o.leader.run(ctx, kubeClient, log, func(ctx context.Context) error { return runAll(ctx, controllers) })
	})
	return runAll(ctx, always)
}

// newSigner reads (or makes) the migration CA and wires the signer of node certificates; its
// informer is the caller's to start.
func newSigner(ctx context.Context, kubeClient kubernetes.Interface, o options, recorder record.EventRecorder, reg prometheus.Registerer, log *slog.Logger) (func(context.Context) error, informers.SharedInformerFactory, error) {
	ca, err := nodecerts.LoadOrCreateCA(ctx, kubeClient, o.namespace)
	if err != nil {
		return nil, nil, err
	}
	csrInformers := nodecerts.NewInformer(kubeClient)
	signer := nodecerts.New(kubeClient, ca, nodecerts.AgentUsername(o.namespace, o.agentAccount), csrInformers.Certificates().V1().CertificateSigningRequests(), recorder, o.nodeCertValidity, reg, log)
	return func(ctx context.Context) error { return signer.Run(ctx, 1) }, csrInformers, nil
}

// runSignerAlone runs the signer of node certificates (--run=signer) and its metrics; of its
// replicas, the one holding the Lease lifeboat-signer signs.
func runSignerAlone(ctx context.Context, kubeClient kubernetes.Interface, o options, log *slog.Logger) error {
	recorder, stopRecorder, err := kube.Recorder(ctx, kubeClient, "lifeboat-signer", "")
	if err != nil {
		return err
	}
	defer stopRecorder()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), kube.RequestsMetric)
	signer, csrInformers, err := newSigner(ctx, kubeClient, o, recorder, reg, log)
	if err != nil {
		return err
	}
	csrInformers.Start(ctx.Done())
	o.leader.name = signerLease
	always := []func(context.Context) error{func(ctx context.Context) error { return o.leader.run(ctx, kubeClient, log, signer) }}
	if o.metricsListen != "" {
		always = append(always, func(ctx context.Context) error {
			return serveMetrics(ctx, o.metricsListen, o.metricsInsecure, reg, kubeClient, log)
		})
	}
	return runAll(ctx, always)
}

// runAll runs each of runners until ctx ends; the first to end (an error, or ctx) ends them all.
func runAll(ctx context.Context, runners []func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(runners))
	for _, r := range runners {
		go func() { errc <- r(ctx) }()
	}
	errs := []error{<-errc}
	cancel()
	for range runners[1:] {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}
