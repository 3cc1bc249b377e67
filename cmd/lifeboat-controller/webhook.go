package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeboat-vm/lifeboat/cmd/internal/serve"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// webhookFlags are the eviction webhook's settings.
type webhookFlags struct {
	listen, url, service string
	certValidity         time.Duration
	clientCA             string
	clientNames          string
	clientAuth           string
}

func (f *webhookFlags) register() {
	flag.StringVar(&f.listen, "webhook-listen", "", `address the eviction webhook serves TLS on, e.g. ":8443"; empty: no webhook`)
	flag.StringVar(&f.url, "webhook-url", "", "URL the API server calls the webhook at (an API server outside the cluster, as in local test clusters); overrides --webhook-service")
	flag.StringVar(&f.service, "webhook-service", "lifeboat-system/lifeboat-webhook", "NAMESPACE/NAME of the Service (port 443) in front of the webhook")
	flag.DurationVar(&f.certValidity, "webhook-cert-validity", 7*24*time.Hour, "life of each self-made serving certificate; it is replaced at two thirds of it")
	flag.StringVar(&f.clientCA, "webhook-client-ca", "", "PEM file of the CAs that sign the client certificate the API server presents to webhooks (its AdmissionConfiguration); required with --webhook-client-auth=strict")
	flag.StringVar(&f.clientNames, "webhook-client-names", "kube-apiserver-webhook-client", "comma-separated common names the API server's webhook client certificate may have")
	flag.StringVar(&f.clientAuth, "webhook-client-auth", string(webhook.ClientAuthAuto), `auto: the webhook acts on reviews it cannot authenticate, within bounds (a live migration at most), until the API server once presents its client certificate, and only for the API server from then on, on every replica; strict: only for the API server from the start (docs/operations.md, "The eviction webhook")`)
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
	if f.listen == "" {
		return opts, nil
	}
	opts.ClientAuth = webhook.ClientAuth(f.clientAuth)
	switch opts.ClientAuth {
	case webhook.ClientAuthAuto:
	case webhook.ClientAuthStrict:
		if f.clientCA == "" {
			return opts, errors.New("--webhook-client-ca is required with --webhook-client-auth=strict: the webhook then acts only for the API server, which it knows by its client certificate (docs/operations.md, \"The eviction webhook\")")
		}
	default:
		return opts, fmt.Errorf("--webhook-client-auth=%q: want auto or strict", f.clientAuth)
	}
	if f.clientCA == "" {
		return opts, nil
	}
	pem, err := os.ReadFile(f.clientCA)
	if err != nil {
		return opts, fmt.Errorf("--webhook-client-ca: %w", err)
	}
	opts.ClientCAs = x509.NewCertPool()
	if !opts.ClientCAs.AppendCertsFromPEM(pem) {
		return opts, fmt.Errorf("--webhook-client-ca=%s: no PEM certificate in it", f.clientCA)
	}
	for _, n := range strings.Split(f.clientNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			opts.ClientNames = append(opts.ClientNames, n)
		}
	}
	if len(opts.ClientNames) == 0 {
		return opts, errors.New("--webhook-client-names is empty: no caller could make the webhook act")
	}
	return opts, nil
}

// serveMetrics serves the registry's metrics on address until ctx ends: with insecure, plain HTTP
// to anyone who can connect, which only a loopback address keeps to the pod; otherwise HTTPS with
// a certificate of its own, to callers the API server authenticates and authorizes.
func serveMetrics(ctx context.Context, address string, insecure bool, reg *prometheus.Registry, kube kubernetes.Interface, log *slog.Logger) error {
	var handler http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	var tlsConfig *tls.Config
	if !insecure {
		var err error
		if tlsConfig, err = serve.SelfSignedTLS("lifeboat-controller"); err != nil {
			return fmt.Errorf("the metrics' serving certificate: %w", err)
		}
		handler = serve.Authorized(handler, kube, log)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", handler)
	return serve.HTTPS(ctx, address, mux, tlsConfig)
}

// checkMetricsListen refuses plain, unauthenticated metrics on anything but a loopback address.
func checkMetricsListen(address string, insecure bool) error {
	if address == "" || !insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("--metrics-listen=%q: %w", address, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--metrics-listen=%q with --metrics-insecure: plain, unauthenticated metrics are served on a loopback address only (such as 127.0.0.1:8080)", address)
	}
	return nil
}
