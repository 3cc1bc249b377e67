package nodecerts

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
)

// CASecret is the Secret, in lifeboat's namespace, that keeps the migration CA's
// certificate and key: every replica and every restart of the signer signs with the same CA,
// so the certificates already issued stay valid.
const CASecret = "lifeboat-migration-ca"

// CA signs node certificates.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// LoadOrCreateCA reads the CA from its Secret in namespace, making it on first use, and
// publishes its certificate in the ConfigMap agents read (migrationtls.CAConfigMap).
func LoadOrCreateCA(ctx context.Context, kube kubernetes.Interface, namespace string) (*CA, error) {
	secrets := kube.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, CASecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		var made *corev1.Secret
		if made, err = newCASecret(namespace); err == nil {
			s, err = secrets.Create(ctx, made, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Another replica made it first: sign with that one.
				s, err = secrets.Get(ctx, CASecret, metav1.GetOptions{})
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading or making the migration CA (Secret %s/%s): %w", namespace, CASecret, err)
	}
	ca, err := parseCA(s)
	if err != nil {
		return nil, err
	}
	if err := publish(ctx, kube, namespace, ca.pem); err != nil {
		return nil, err
	}
	return ca, nil
}

// NewCA makes a new CA, valid for ten years.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "lifeboat-migration-ca", Organization: []string{migrationtls.Organization}}, key)
	if err != nil {
		return nil, err
	}
	return &CA{cert: c, key: key, pem: pemCert(c.Raw)}, nil
}

// PEM is the CA's certificate, which peers trust.
func (ca *CA) PEM() []byte { return ca.pem }

func newCASecret(namespace string) (*corev1.Secret, error) {
	ca, err := NewCA()
	if err != nil {
		return nil, err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(ca.key)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CASecret, Namespace: namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: ca.pem, corev1.TLSPrivateKeyKey: keyPEM},
	}, nil
}

func parseCA(s *corev1.Secret) (*CA, error) {
	certs, err := cert.ParseCertsPEM(s.Data[corev1.TLSCertKey])
	if err != nil {
		return nil, fmt.Errorf("the migration CA's certificate in Secret %s: %w", s.Name, err)
	}
	key, err := keyutil.ParsePrivateKeyPEM(s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("the migration CA's key in Secret %s: %w", s.Name, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("the migration CA's key in Secret %s cannot sign", s.Name)
	}
	return &CA{cert: certs[0], key: signer, pem: pemCert(certs[0].Raw)}, nil
}

// publish writes the CA's certificate to the ConfigMap agents trust.
func publish(ctx context.Context, kube kubernetes.Interface, namespace string, caPEM []byte) error {
	cms := kube.CoreV1().ConfigMaps(namespace)
	want := map[string]string{migrationtls.CAKey: string(caPEM)}
	cm, err := cms.Get(ctx, migrationtls.CAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: migrationtls.CAConfigMap, Namespace: namespace}, Data: want}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case err == nil && cm.Data[migrationtls.CAKey] != want[migrationtls.CAKey]:
		cm.Data = want
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publishing the migration CA (ConfigMap %s/%s): %w", namespace, migrationtls.CAConfigMap, err)
	}
	return nil
}

// clockSkew backdates every certificate, as Kubernetes' own signer does, so that a node whose
// clock is a little behind accepts it at once; a short-lived certificate is backdated by a
// tenth of its life at most, or its holder would find it due for renewal as soon as it came.
const clockSkew = 5 * time.Minute

// Sign issues node's certificate for the request's public key, valid for lifetime (never
// beyond the CA's own end).
func (ca *CA) Sign(req *x509.CertificateRequest, node string, lifetime time.Duration, now time.Time) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	subject := migrationtls.Template(node)
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject.Subject,
		DNSNames:              subject.DNSNames,
		NotBefore:             now.Add(-min(clockSkew, lifetime/10)),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, req.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate of node %s: %w", node, err)
	}
	return pemCert(der), nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: cert.CertificateBlockType, Bytes: der})
}
