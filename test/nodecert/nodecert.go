// Package nodecert gives tests node certificates from lifeboat's real migration CA
// (evacuation/nodecerts), without the certificates API in between.
package nodecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/evacuation/nodecerts"
)

// Static is a node's certificate and the CAs it trusts (migrationtls.Certificates).
type Static struct {
	Cert  *tls.Certificate
	Trust *x509.CertPool
}

// Current is the node's certificate.
func (s *Static) Current() *tls.Certificate { return s.Cert }

// Roots is the pool the node trusts.
func (s *Static) Roots() (*x509.CertPool, error) { return s.Trust, nil }

var _ migrationtls.Certificates = (*Static)(nil)

// NewCA makes a CA for one test.
func NewCA(t testing.TB) *nodecerts.CA {
	t.Helper()
	ca, err := nodecerts.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Issue signs a certificate for node with ca, which it trusts.
func Issue(t testing.TB, ca *nodecerts.CA, node string) *Static {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	req := migrationtls.Template(node)
	req.PublicKey = key.Public()
	certPEM, err := ca.Sign(req, node, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, pemKey(keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	return &Static{Cert: &pair, Trust: pool}
}

func pemKey(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
