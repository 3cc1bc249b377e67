// Package nodecert keeps this node's migration certificate (api/migrationtls): client-go's
// certificate manager, as the kubelet uses for its own, requests it from lifeboat's signer
// through the certificates API, stores it on the node and renews it before it expires; the
// CA that peers' certificates must chain to is read from the ConfigMap the signer publishes.
package nodecert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
)

// Certificates is this node's migration certificate and the trusted CA.
type Certificates struct {
	manager   certificate.Manager
	kube      kubernetes.Interface
	namespace string

	mu      sync.Mutex
	roots   *x509.CertPool
	readAt  time.Time
	rootPEM string
}

// rootsTTL is how long the CA read from its ConfigMap is used before it is read again.
const rootsTTL = time.Minute

// Start begins keeping node's certificate in dir (lifeboat-migration-current.pem); the CA is
// read from the ConfigMap in namespace. The manager runs until ctx ends; until the first
// certificate is signed, Current is nil. Renewals and their failures are counted in reg.
func Start(ctx context.Context, kube kubernetes.Interface, node, dir, namespace string, reg prometheus.Registerer) (*Certificates, error) {
	renewed := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lifeboat_agent_migration_certificate_age_at_renewal_seconds",
		Help:    "Age of this node's migration certificate when a new one replaced it.",
		Buckets: prometheus.ExponentialBuckets(60, 4, 8),
	})
	failed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lifeboat_agent_migration_certificate_renewal_failures_total",
		Help: "Failed attempts to get this node's migration certificate signed.",
	})
	if err := errors.Join(reg.Register(renewed), reg.Register(failed)); err != nil {
		return nil, err
	}
	store, err := certificate.NewFileStore("lifeboat-migration", dir, dir, "", "")
	if err != nil {
		return nil, fmt.Errorf("the migration certificate's store in %s: %w", dir, err)
	}
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn:      func(*tls.Certificate) (kubernetes.Interface, error) { return kube, nil },
		Template:         migrationtls.Template(node),
		SignerName:       migrationtls.SignerName,
		Usages:           migrationtls.Usages,
		CertificateStore: store,
		// client-go reports the replaced certificate's age in seconds.
		CertificateRotation:     renewed,
		CertificateRenewFailure: failed,
		Name:                    "lifeboat-migration",
		Ctx:                     &ctx,
	})
	if err != nil {
		return nil, fmt.Errorf("the migration certificate's manager: %w", err)
	}
	// The manager renews at 70 to 90% of the certificate's life: one near its end means renewals
	// fail, and migrations to and from the node will.
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lifeboat_agent_migration_certificate_expiry_timestamp_seconds",
		Help: "When this node's migration certificate expires (Unix time); NaN until one is signed.",
	}, func() float64 {
		if c := m.Current(); c != nil && c.Leaf != nil {
			return float64(c.Leaf.NotAfter.Unix())
		}
		return math.NaN()
	})
	if err := reg.Register(expiry); err != nil {
		return nil, err
	}
	m.Start()
	context.AfterFunc(ctx, m.Stop)
	return &Certificates{manager: m, kube: kube, namespace: namespace}, nil
}

// Current is this node's certificate, nil until one is signed.
func (c *Certificates) Current() *tls.Certificate { return c.manager.Current() }

// Roots is the migration CA, read from its ConfigMap at most once a rootsTTL.
func (c *Certificates) Roots() (*x509.CertPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.roots != nil && time.Since(c.readAt) < rootsTTL {
		return c.roots, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cm, err := c.kube.CoreV1().ConfigMaps(c.namespace).Get(ctx, migrationtls.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the migration CA (ConfigMap %s/%s): %w", c.namespace, migrationtls.CAConfigMap, err)
	}
	pem := cm.Data[migrationtls.CAKey]
	if pem != c.rootPEM || c.roots == nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(pem)) {
			return nil, fmt.Errorf("ConfigMap %s/%s holds no certificate under %s", c.namespace, migrationtls.CAConfigMap, migrationtls.CAKey)
		}
		c.roots, c.rootPEM = pool, pem
	}
	c.readAt = time.Now()
	return c.roots, nil
}
