package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCertificateRotation serves TLS with the rotating certificate over a real socket: a client that
// trusts the bundle written at rotation accepts the old certificate and the new one, and the
// rotation is due at two thirds of the certificate's life.
func TestCertificateRotation(t *testing.T) {
	c, err := newCerts([]string{"127.0.0.1"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if due := time.Until(c.rotateAt()); due < 15*time.Second || due > 21*time.Second {
		t.Errorf("rotation due in %s, want about 20s (two thirds of 30s)", due)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), TLSConfig: &tls.Config{GetCertificate: c.getCertificate}}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	serial := func(bundle []byte) string {
		t.Helper()
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bundle) {
			t.Fatal("the CA bundle holds no certificate")
		}
		conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("a client trusting the bundle: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial(c.caBundle())

	serving, ca, bundle, err := c.next()
	if err != nil {
		t.Fatal(err)
	}
	if got := serial(bundle); got != before {
		t.Errorf("before the switch the old certificate is served (%s), got %s", before, got)
	}
	c.install(serving, ca, bundle)
	if after := serial(bundle); after == before {
		t.Error("after the switch a new certificate must be served")
	}
	if after := serial(c.caBundle()); after == before {
		t.Error("the installed bundle must trust the new certificate")
	}
}

// TestTheCertificateExpiryMetricFollowsRotation: the gauge an alert watches says when the
// certificate now served expires, before and after a rotation.
func TestTheCertificateExpiryMetricFollowsRotation(t *testing.T) {
	c, err := newCerts([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	newMetrics(reg, c.expiry)
	expiry := func() int64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "lifeboat_eviction_webhook_certificate_expiry_timestamp_seconds" {
				return int64(f.GetMetric()[0].GetGauge().GetValue())
			}
		}
		t.Fatal("no certificate expiry metric")
		return 0
	}
	served := func() int64 {
		leaf, _ := c.getCertificate(nil)
		return leaf.Leaf.NotAfter.Unix()
	}
	if got, want := expiry(), served(); got != want {
		t.Errorf("expiry metric %d, want the served certificate's %d", got, want)
	}
	c.maxAge = 2 * time.Hour
	serving, ca, bundle, err := c.next()
	if err != nil {
		t.Fatal(err)
	}
	c.install(serving, ca, bundle)
	if got, want := expiry(), served(); got != want {
		t.Errorf("after rotation: expiry metric %d, want the new certificate's %d", got, want)
	}
}
