// Package migrationtls is the contract between agents for migration traffic between nodes:
// each agent holds a certificate naming its node, signed by lifeboat's migration CA through the
// Kubernetes certificates API, and every stream of a migration is TLS 1.3 with both sides
// checked. The target accepts only the source node the migration names and only for that
// migration (its ALPN protocol carries the migration's UID); the source accepts only the
// target node.
package migrationtls

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// SignerName is the certificates API signer that lifeboat's controller runs for node certificates.
const SignerName = "lifeboat.dev/migration"

// CAConfigMap is the ConfigMap, in the controller's namespace, whose CAKey holds the PEM of the
// migration CA: agents trust it for their peers.
const (
	CAConfigMap = "lifeboat-migration-ca"
	CAKey       = "ca.crt"
)

// Organization is every node certificate's subject organization.
const Organization = "lifeboat:nodes"

// commonNamePrefix starts the subject common name of a node's certificate (as the kubelet's
// "system:node:" does).
const commonNamePrefix = "lifeboat:node:"

// NodeNameExtra is the user-info extra that the API server puts in the identity of a service
// account token bound to a node (or to a pod on one): the node's name.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Usages are the key usages a node certificate is requested and signed with: it serves the
// node's target proxies and authenticates its source proxies.
var Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}

// CommonName is the subject common name of node's certificate.
func CommonName(node string) string { return commonNamePrefix + node }

// NodeOf is the node a certificate's common name names, if it names one.
func NodeOf(commonName string) (string, bool) {
	node, ok := strings.CutPrefix(commonName, commonNamePrefix)
	return node, ok && node != ""
}

// Template is the certificate request of node's agent: the common name, and the node's name as
// the DNS name its target proxies are reached by.
func Template(node string) *x509.CertificateRequest {
	return &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: CommonName(node), Organization: []string{Organization}},
		DNSNames: []string{node},
	}
}

// protocolPrefix starts the ALPN protocol of a migration's streams.
const protocolPrefix = "lifeboat-migration/"

// Protocol is the ALPN protocol of the streams of the migration with migrationUID: a stream
// offered for another migration fails the handshake.
func Protocol(migrationUID string) string { return protocolPrefix + migrationUID }

// Certificates gives the current certificate of this node (nil until one is issued) and the
// pool of CAs its peers' certificates must chain to.
type Certificates interface {
	Current() *tls.Certificate
	Roots() (*x509.CertPool, error)
}

// ErrNoCertificate is returned while this node has no certificate yet.
var ErrNoCertificate = errors.New("this node has no migration certificate yet (its certificate signing request is not signed)")

// ServerConfig is the TLS configuration of a target proxy of the migration migrationUID, which
// accepts only sourceNode; ErrNoCertificate while this node has no certificate.
func ServerConfig(certs Certificates, migrationUID, sourceNode string) (*tls.Config, error) {
	roots, err := ready(certs)
	if err != nil {
		return nil, err
	}
	proto := Protocol(migrationUID)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  roots,
		NextProtos: []string{proto},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return current(certs)
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cs.NegotiatedProtocol != proto {
				return fmt.Errorf("the stream is not for migration %s (protocol %q)", migrationUID, cs.NegotiatedProtocol)
			}
			return peerIs(cs, sourceNode)
		},
	}, nil
}

// ClientConfig is the TLS configuration of a source proxy of the migration migrationUID, which
// connects only to targetNode; ErrNoCertificate while this node has no certificate.
func ClientConfig(certs Certificates, migrationUID, targetNode string) (*tls.Config, error) {
	roots, err := ready(certs)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    roots,
		// The target's certificate names its node as its DNS name, which Go checks.
		ServerName: targetNode,
		NextProtos: []string{Protocol(migrationUID)},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return current(certs)
		},
		VerifyConnection: func(cs tls.ConnectionState) error { return peerIs(cs, targetNode) },
	}, nil
}

// ready returns the trusted CAs once this node has a certificate (ErrNoCertificate before).
func ready(certs Certificates) (*x509.CertPool, error) {
	if certs.Current() == nil {
		return nil, ErrNoCertificate
	}
	return certs.Roots()
}

func current(certs Certificates) (*tls.Certificate, error) {
	if c := certs.Current(); c != nil {
		return c, nil
	}
	return nil, ErrNoCertificate
}

// peerIs checks that the verified peer certificate is node's.
func peerIs(cs tls.ConnectionState, node string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the peer sent no certificate")
	}
	cn := cs.PeerCertificates[0].Subject.CommonName
	if got, ok := NodeOf(cn); !ok || got != node {
		return fmt.Errorf("the peer is %q, want node %s", cn, node)
	}
	return nil
}
