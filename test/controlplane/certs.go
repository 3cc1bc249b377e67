package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the set of keys and certificates one control plane uses, written as PEM files in dir.
type pki struct {
	CACert, CAKey         string
	ServingCert, ServeKey string
	AdminCert, AdminKey   string
	SAPub, SAKey          string
	// WebhookCert is the client certificate the API server presents to admission webhooks.
	WebhookCert, WebhookKey string
	// KubeletClientCert is the client certificate the API server presents to kubelets (logs,
	// exec, port-forward), as kubeadm's apiserver-kubelet-client.
	KubeletClientCert, KubeletClientKey string

	ca *issuer
}

// WebhookClientName is the common name of the API server's client certificate for webhooks,
// lifeboat-controller's default --webhook-client-names.
const WebhookClientName = "kube-apiserver-webhook-client"

// KubeletClientName is the common name, and so the user name, of the API server's client
// certificate for kubelets (kubeadm's); the control plane binds it to system:kubelet-api-admin.
const KubeletClientName = "kube-apiserver-kubelet-client"

type issuer struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newPKI(dir string) (pki, error) {
	p := pki{
		CACert: filepath.Join(dir, "ca.crt"), CAKey: filepath.Join(dir, "ca.key"),
		ServingCert: filepath.Join(dir, "apiserver.crt"), ServeKey: filepath.Join(dir, "apiserver.key"),
		AdminCert: filepath.Join(dir, "admin.crt"), AdminKey: filepath.Join(dir, "admin.key"),
		SAPub: filepath.Join(dir, "sa.pub"), SAKey: filepath.Join(dir, "sa.key"),
		WebhookCert: filepath.Join(dir, "webhook-client.crt"), WebhookKey: filepath.Join(dir, "webhook-client.key"),
		KubeletClientCert: filepath.Join(dir, "kubelet-client.crt"), KubeletClientKey: filepath.Join(dir, "kubelet-client.key"),
	}
	ca, err := newCA(p.CACert, p.CAKey)
	if err != nil {
		return p, err
	}
	p.ca = ca
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := ca.issue(serving, p.ServingCert, p.ServeKey); err != nil {
		return p, err
	}
	admin := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "lifeboat-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := ca.issue(admin, p.AdminCert, p.AdminKey); err != nil {
		return p, err
	}
	webhookClient := &x509.Certificate{
		Subject:     pkix.Name{CommonName: WebhookClientName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := ca.issue(webhookClient, p.WebhookCert, p.WebhookKey); err != nil {
		return p, err
	}
	kubeletClient := &x509.Certificate{
		Subject:     pkix.Name{CommonName: KubeletClientName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := ca.issue(kubeletClient, p.KubeletClientCert, p.KubeletClientKey); err != nil {
		return p, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	if err := writeKey(p.SAKey, key); err != nil {
		return p, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return p, err
	}
	return p, writePEM(p.SAPub, "PUBLIC KEY", pub)
}

func newCA(certPath, keyPath string) (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lifeboat-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, err
	}
	return &issuer{cert: cert, key: key}, nil
}

func (ca *issuer) issue(tmpl *x509.Certificate, certPath, keyPath string) error {
	der, key, err := ca.sign(tmpl)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return err
	}
	return writeKey(keyPath, key)
}

// sign makes a key and a certificate for it from tmpl, signed by the CA.
func (ca *issuer) sign(tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing a certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, key, nil
}

// ClientCertificate issues a client certificate from the cluster CA: the API server, and
// whatever else trusts its client CA (an emulated node's kubelet API), authenticates its holder
// as user, in groups.
func (cp *ControlPlane) ClientCertificate(user string, groups ...string) (tls.Certificate, error) {
	der, key, err := cp.pki.ca.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
