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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/cmd/internal/kube"
	"github.com/lifeboat-vm/lifeboat/evacuation/evacuate"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	image := flag.String("launcher-image", "lifeboat.dev/lifeboat-launcher:dev", "image of launcher pods")
	accel := flag.String("acceleration", "auto", "guest acceleration launchers use: kvm, tcg, or auto (KVM only if a probe boot proves it works)")
	workers := flag.Int("workers", 4, "workers per controller")
	hostNetwork := flag.Bool("launcher-host-network", false, "run launcher pods in their node's network namespace (for nodes without a pod network)")
	var leader election
	leader.addFlags(flag.CommandLine)
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*kubeconfig, vmi.PodOptions{Image: *image, Acceleration: *accel, HostNetwork: *hostNetwork}, *workers, &leader, log); err != nil {
		log.Error("lifeboat-controller failed", "err", err)
		os.Exit(1)
	}
}

func run(kubeconfig string, podOpts vmi.PodOptions, workers int, leader *election, log *slog.Logger) error {
	switch podOpts.Acceleration {
	case "kvm", "tcg", "auto":
	default:
		return fmt.Errorf("--acceleration=%q: want kvm, tcg or auto", podOpts.Acceleration)
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

	// What every replica serves (the eviction webhook) starts here, before the election.
	return leader.run(ctx, kubeClient, log, func(ctx context.Context) error {
		return runControllers(ctx, kubeClient, lb, recorder, podOpts, workers, log)
	})
}

// runControllers runs the cluster-side controllers until ctx ends or one of them fails.
func runControllers(ctx context.Context, kubeClient kubernetes.Interface, lb lifeboatclient.Interface, recorder record.EventRecorder,
	podOpts vmi.PodOptions, workers int, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kubeInformers := informers.NewSharedInformerFactoryWithOptions(kubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	vmiController := vmi.New(kubeClient, lb, lbv1.VirtualMachineInstances(), kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	evacuationController := evacuate.New(lb, lbv1.VirtualMachineInstances(), lbv1.VirtualMachineInstanceMigrations(), lbv1.LifeboatConfigs(), recorder, log)
	migrationController := migration.New(kubeClient, lb, lbv1.VirtualMachineInstanceMigrations(), lbv1.VirtualMachineInstances(), kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())

	errc := make(chan error, 3)
	go func() { errc <- vmiController.Run(ctx, workers) }()
	go func() { errc <- evacuationController.Run(ctx) }()
	go func() { errc <- migrationController.Run(ctx, workers) }()
	err := <-errc
	cancel()
	return errors.Join(err, <-errc, <-errc)
}
