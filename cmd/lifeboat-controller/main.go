// Command lifeboat-controller runs lifeboat's cluster-side controllers.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	image := flag.String("launcher-image", "lifeboat-launcher:dev", "image of launcher pods")
	accel := flag.String("acceleration", "auto", "guest acceleration launchers use: kvm, tcg, or auto (KVM only if a probe boot proves it works)")
	workers := flag.Int("workers", 4, "workers per controller")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*kubeconfig, vmi.PodOptions{Image: *image, Acceleration: *accel}, *workers, log); err != nil {
		log.Error("lifeboat-controller failed", "err", err)
		os.Exit(1)
	}
}

func run(kubeconfig string, podOpts vmi.PodOptions, workers int, log *slog.Logger) error {
	switch podOpts.Acceleration {
	case "kvm", "tcg", "auto":
	default:
		return fmt.Errorf("--acceleration=%q: want kvm, tcg or auto", podOpts.Acceleration)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the client configuration: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	lb, err := lifeboatclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	if err := v1alpha1.AddToScheme(scheme.Scheme); err != nil {
		return err
	}
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "lifeboat-controller"})

	kubeInformers := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	vmiController := vmi.New(kube, lb, lbInformers.Lifeboat().V1alpha1().VirtualMachineInstances(),
		kubeInformers.Core().V1().Pods(), recorder, podOpts, log)
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())
	return vmiController.Run(ctx, workers)
}
