package nodecert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes/fake"
)

// TestTheExpiryMetricIsTheStoredCertificates: an agent that restarts with a certificate on the
// node reports when that certificate expires, which is what the certificate alert watches.
func TestTheExpiryMetricIsTheStoredCertificates(t *testing.T) {
	dir := t.TempDir()
	notAfter := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	writeCertificate(t, filepath.Join(dir, "lifeboat-migration-current.pem"), notAfter)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg := prometheus.NewRegistry()
	if _, err := Start(ctx, fake.NewClientset(), "node-a", dir, "lifeboat-system", reg); err != nil {
		t.Fatal(err)
	}
	got, err := testutil.GatherAndCount(reg, "lifeboat_agent_migration_certificate_expiry_timestamp_seconds")
	if err != nil || got != 1 {
		t.Fatalf("%d expiry series (%v), want 1", got, err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "lifeboat_agent_migration_certificate_expiry_timestamp_seconds" {
			if v := f.GetMetric()[0].GetGauge().GetValue(); v != float64(notAfter.Unix()) {
				t.Errorf("expiry %v, want the stored certificate's %d", v, notAfter.Unix())
			}
		}
	}
}

func writeCertificate(t *testing.T, path string, notAfter time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node-a"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	data := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
