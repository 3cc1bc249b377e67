// Command lifeboat-controller runs lifeboat's cluster-side controllers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/cmd/internal/kube"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	image := flag.String("launcher-image", "lifeboat-launcher:dev", "image of launcher pods")
	accel := flag.String("acceleration", "auto", "guest acceleration launchers use: kvm, tcg, or auto (KVM only if a probe boot proves it works)")
	workers := flag.Int("workers", 4, "workers per controller")
	heartbeat := flag.Duration("eviction-heartbeat-interval", time.Minute,
		"how often the EvictionRequest responder reports progress on an Eviction when nothing changes (20s to 3m)")
	metricsAddr := flag.String("metrics-listen", "", "address for Prometheus /metrics, e.g. 127.0.0.1:9090; empty: not served")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	opts := options{podOpts: vmi.PodOptions{Image: *image, Acceleration: *accel}, workers: *workers, metricsAddr: *metricsAddr,
		heartbeat: responder.Settings{Min: responder.MinHeartbeatInterval, Max: *heartbeat}}
	if err := run(*kubeconfig, opts, log); err != nil {
		log.Error("lifeboat-controller failed", "err", err)
		os.Exit(1)
	}
}

type options struct {
	podOpts     vmi.PodOptions
	workers     int
	metricsAddr string
	heartbeat   responder.Settings
}

func run(kubeconfig string, opts options, log *slog.Logger) error {
	podOpts, workers := opts.podOpts, opts.workers
	switch podOpts.Acceleration {
	case "kvm", "tcg", "auto":
	default:
		return fmt.Errorf("--acceleration=%q: want kvm, tcg or auto", podOpts.Acceleration)
	}
	if err := opts.heartbeat.Validate(); err != nil {
		return fmt.Errorf("--eviction-heartbeat-interval: %w", err)
	}
	kubeClient, lb, err := kube.Clients(kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
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
	reg := prometheus.NewRegistry()
	if opts.metricsAddr != "" {
		srv := &http.Server{Addr: opts.metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serving metrics", "err", err)
			}
		}()
		defer srv.Close()
	}

	kubeInformers := informers.NewSharedInformerFactoryWithOptions(kubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	vmiController := vmi.New(kubeClient, lb, lbv1.VirtualMachineInstances(), kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	evacuationController := evacuate.New(lb, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(), recorder, log)
	migrationController := migration.New(kubeClient, lb, lbv1.VirtualMachineInstanceMigrations(), lbv1.VirtualMachineInstances(), kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	runs := []func() error{
		func() error { return vmiController.Run(ctx, workers) },
		func() error { return evacuationController.Run(ctx) },
		func() error { return migrationController.Run(ctx, workers) },
	}
	if podOpts.EvictionResponder {
		evInformers := informers.NewSharedInformerFactoryWithOptions(kubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = responder.EvictionSelector
		}))
		r, err := responder.New(kubeClient, lb, responder.Informers{
			Evictions: evInformers.Lifecycle().V1alpha1().Evictions(), Pods: kubeInformers.Core().V1().Pods(),
			VMIs: lbv1.VirtualMachineInstances(), Migrations: lbv1.VirtualMachineInstanceMigrations(), Configs: lbv1.LifeboatConfigs(),
		}, recorder, responder.NewMetrics(reg), opts.heartbeat, log)
		if err != nil {
			return err
		}
		evInformers.Start(ctx.Done())
		runs = append(runs, func() error { return r.Run(ctx, workers) })
	}
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())

	errc := make(chan error, len(runs))
	for _, f := range runs {
		go func() { errc <- f() }()
	}
	errs := []error{<-errc}
	cancel()
	for range runs[1:] {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}
