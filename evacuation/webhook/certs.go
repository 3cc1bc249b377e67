package webhook

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"sync"
	"time"

	"k8s.io/client-go/util/cert"
)

// certs is the webhook's serving certificate with its own CA, made in memory and rotated by
// Server.Run: nothing secret is ever stored, and a restart simply makes a new pair.
type certs struct {
	hosts  []string
	maxAge time.Duration

	mu      sync.RWMutex
	serving *tls.Certificate
	ca      []byte // PEM of the CA that signed serving
	bundle  []byte // PEM: ca, then the previous CA while clients may still hold it
	issued  time.Time
	expires time.Time
}

// newCerts makes a first certificate for hosts (IPs or DNS names), valid for maxAge.
func newCerts(hosts []string, maxAge time.Duration) (*certs, error) {
	c := &certs{hosts: hosts, maxAge: maxAge}
	serving, ca, err := c.generate()
	if err != nil {
		return nil, err
	}
	c.install(serving, ca, ca)
	return c, nil
}

// generate makes a new CA and a serving certificate signed by it.
func (c *certs) generate() (*tls.Certificate, []byte, error) {
	var ips []net.IP
	var dns []string
	for _, h := range c.hosts[1:] {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	chain, key, err := cert.GenerateSelfSignedCertKeyWithOptions(cert.SelfSignedCertKeyOptions{
		// The library backdates certificates by an hour (clock skew) and counts MaxAge from there.
		Host: c.hosts[0], AlternateIPs: ips, AlternateDNS: dns, MaxAge: c.maxAge + time.Hour,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("making the webhook's certificate: %w", err)
	}
	// The chain is the serving certificate followed by its CA.
	leaf, rest := pem.Decode(chain)
	if leaf == nil {
		return nil, nil, fmt.Errorf("making the webhook's certificate: no certificate in the generated chain")
	}
	pair, err := tls.X509KeyPair(pem.EncodeToMemory(leaf), key)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the webhook's certificate: %w", err)
	}
	return &pair, bytes.TrimSpace(rest), nil
}

func (c *certs) install(serving *tls.Certificate, ca, bundle []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.serving, c.ca, c.bundle, c.issued, c.expires = serving, ca, bundle, time.Now(), serving.Leaf.NotAfter
}

// expiry is when the current certificate expires.
func (c *certs) expiry() time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.expires
}

// getCertificate serves the current certificate (tls.Config.GetCertificate).
func (c *certs) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.serving, nil
}

// caBundle is what the webhook configuration must trust.
func (c *certs) caBundle() []byte {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.bundle
}

// rotateAt is when the current certificate should be replaced: when two thirds of the time it
// had left when installed have passed.
func (c *certs) rotateAt() time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.issued.Add(c.expires.Sub(c.issued) * 2 / 3)
}

// next makes the successor certificate and the bundle that trusts both it and the current one,
// so the API server accepts either while the configuration and the listener change over.
func (c *certs) next() (serving *tls.Certificate, ca, bundle []byte, err error) {
	serving, ca, err = c.generate()
	if err != nil {
		return nil, nil, nil, err
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return serving, ca, append(append(append([]byte{}, ca...), '\n'), c.ca...), nil
}
