// Package kube is the API wiring lifeboat's commands (and the benchmarks that stand in for them) share: clients and an event recorder.
package kube

import (
	"context"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Client rate limits of lifeboat's commands.
const (
	ClientQPS   = 100
	ClientBurst = 200
)

// Clients connects with the kubeconfig file, or in-cluster when it is empty. Every request they
// make is counted in RequestsMetric.
func Clients(kubeconfig string) (kubernetes.Interface, lifeboatclient.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the client configuration: %w", err)
	}
	// client-go's default (5 requests/s) would queue the eviction webhook's marks behind each other
	// during a drain; the API server's own priority and fairness protects it.
	cfg.QPS, cfg.Burst = ClientQPS, ClientBurst
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { return countingTransport{next} })
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	lb, err := lifeboatclient.NewForConfig(cfg)
	return kube, lb, err
}

// Recorder records Events on core and lifeboat objects as component (on host, if not empty)
// until ctx ends; stop flushes it.
func Recorder(ctx context.Context, kube kubernetes.Interface, component, host string) (rec record.EventRecorder, stop func(), err error) {
	if err := v1alpha1.AddToScheme(scheme.Scheme); err != nil {
		return nil, nil, err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component, Host: host}), broadcaster.Shutdown, nil
}
