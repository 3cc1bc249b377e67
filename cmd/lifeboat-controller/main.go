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

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/cmd/internal/kube"
	"github.com/lifeboat-vm/lifeboat/evacuation/cancellation"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	image := flag.String("launcher-image", "lifeboat-launcher:dev", "image of launcher pods")
	accel := flag.String("acceleration", "auto", "guest acceleration launchers use: kvm, tcg, or auto (KVM only if a probe boot proves it works)")
	workers := flag.Int("workers", 4, "workers per controller")
	metricsListen := flag.String("metrics-listen", "", `address to serve Prometheus metrics on (/metrics), e.g. ":8080"; empty: none`)
	var hook webhookFlags
	hook.register()
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*kubeconfig, vmi.PodOptions{Image: *image, Acceleration: *accel}, *workers, *metricsListen, hook, log); err != nil {
		log.Error("lifeboat-controller failed", "err", err)
		os.Exit(1)
	}
}

func run(kubeconfig string, podOpts vmi.PodOptions, workers int, metricsListen string, hook webhookFlags, log *slog.Logger) error {
	switch podOpts.Acceleration {
	case "kvm", "tcg", "auto":
	default:
		return fmt.Errorf("--acceleration=%q: want kvm, tcg or auto", podOpts.Acceleration)
	}
	hookOpts, err := hook.options()
	if err != nil {
		return err
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

	kubeInformers := informers.NewSharedInformerFactoryWithOptions(kubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	vmiController := vmi.New(kubeClient, lb, lbv1.VirtualMachineInstances(), kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	evacuationController := evacuate.New(lb, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(), recorder, log)
	migrationController := migration.New(kubeClient, lb, lbv1.VirtualMachineInstanceMigrations(), lbv1.VirtualMachineInstances(), kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	disruptionController := disruption.New(kubeClient, lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), kubeInformers.Core().V1().Pods(), recorder, log)
	cancelController := cancellation.New(lb, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), recorder, log)
	reg := prometheus.NewRegistry()
	runners := []func(context.Context) error{
		func(ctx context.Context) error { return vmiController.Run(ctx, workers) },
		evacuationController.Run,
		func(ctx context.Context) error { return migrationController.Run(ctx, workers) },
		func(ctx context.Context) error { return disruptionController.Run(ctx, workers) },
		cancelController.Run,
	}
	if hookOpts.Listen != "" {
		hookServer, err := webhook.New(kubeClient, lb, kubeInformers.Core().V1().Pods(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(), recorder, hookOpts, reg, log)
		if err != nil {
			return err
		}
		runners = append(runners, hookServer.Run)
	}
	if metricsListen != "" {
		runners = append(runners, func(ctx context.Context) error { return serveMetrics(ctx, metricsListen, reg) })
	}
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())

	// The first to end (an error, or ctx) ends them all.
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
