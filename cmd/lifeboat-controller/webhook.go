package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// webhookFlags are the eviction webhook's settings.
type webhookFlags struct {
	listen, url, service string
	certValidity         time.Duration
}

func (f *webhookFlags) register() {
	flag.StringVar(&f.listen, "webhook-listen", "", `address the eviction webhook serves TLS on, e.g. ":8443"; empty: no webhook`)
	flag.StringVar(&f.url, "webhook-url", "", "URL the API server calls the webhook at (an API server outside the cluster, as in local test clusters); overrides --webhook-service")
	flag.StringVar(&f.service, "webhook-service", "lifeboat-system/lifeboat-webhook", "NAMESPACE/NAME of the Service (port 443) in front of the webhook")
	flag.DurationVar(&f.certValidity, "webhook-cert-validity", 7*24*time.Hour, "life of each self-made serving certificate; it is replaced at two thirds of it")
}

func (f *webhookFlags) options() (webhook.Options, error) {
	opts := webhook.Options{Listen: f.listen, CertValidity: f.certValidity, Endpoint: webhook.Endpoint{URL: f.url}}
	if f.url == "" {
		ns, name, ok := strings.Cut(f.service, "/")
		if !ok || ns == "" || name == "" {
			return opts, fmt.Errorf("--webhook-service=%q: want NAMESPACE/NAME", f.service)
		}
		opts.Endpoint.Service = types.NamespacedName{Namespace: ns, Name: name}
	}
	if f.certValidity < time.Minute {
		return opts, fmt.Errorf("--webhook-cert-validity=%s: want at least a minute", f.certValidity)
	}
	return opts, nil
}

// serveMetrics serves the registry's metrics on address until ctx ends.
func serveMetrics(ctx context.Context, address string, reg *prometheus.Registry) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Bounded, so that slow clients cannot pin goroutines and buffers (issue 26).
	srv := &http.Server{Addr: address, Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving metrics on %s: %w", address, err)
	}
	return nil
}
