// Package nodecerts is the signer of lifeboat's node certificates (api/migrationtls): it keeps
// the migration CA, approves the certificate signing requests of agents for their own node only,
// and signs them, so that migration streams between nodes are mutually authenticated.
package nodecerts

import (
	"crypto/x509"
	"fmt"
	"slices"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
)

// Request is what the signer knows of a certificate signing request.
type Request struct {
	CSR    *x509.CertificateRequest
	Usages []certificatesv1.KeyUsage
	// Username requested the certificate; TokenNode is the node named in the requester's
	// identity (migrationtls.NodeNameExtra), "" if it names none.
	Username  string
	TokenNode string
	// Agent is the username of lifeboat's agents (their service account's). A token bound to a
	// node is all an agent needs, but any pod on the node has one (cert-manager's, a mesh's):
	// the node's certificate is only for the agent's.
	Agent string
	// MayRequestForNode is whether RBAC lets the requester ask for a certificate of the node the
	// request names (lifeboat.dev nodecertificates, verb create, that node's name): for agents
	// that run outside a pod, with credentials an admin made. Asked of anyone but an agent with
	// a token bound to that node.
	MayRequestForNode func(node string) (bool, error)
}

// Decision is the signer's answer: approve, or deny with a reason and a message for the requester.
type Decision struct {
	Approve bool
	Node    string
	Reason  string
	Message string
}

// Denial reasons, on the Denied condition.
const (
	ReasonMalformed     = "MalformedRequest"
	ReasonNotThisNode   = "NodeMismatch"
	ReasonNotAuthorized = "NotAuthorized"
)

// ReasonApproved is the reason of the Approved condition.
const ReasonApproved = "LifeboatNodeCertificate"

// Review decides a request: the subject must be exactly one node's identity with no other name
// than the node's own, for serving and client use only, and the requester must speak for that
// node: it is lifeboat's agent with a token bound to the node (or to a pod on it), or RBAC grants
// it that node by name.
func Review(r Request) (Decision, error) {
	deny := func(reason, format string, args ...any) (Decision, error) {
		return Decision{Reason: reason, Message: fmt.Sprintf(format, args...)}, nil
	}
	csr := r.CSR
	node, ok := migrationtls.NodeOf(csr.Subject.CommonName)
	if !ok {
		return deny(ReasonMalformed, "the common name %q is not %q followed by a node name", csr.Subject.CommonName, migrationtls.CommonName(""))
	}
	if !slices.Equal(csr.Subject.Organization, []string{migrationtls.Organization}) || len(csr.Subject.OrganizationalUnit) > 0 {
		return deny(ReasonMalformed, "the organization must be exactly %q", migrationtls.Organization)
	}
	if !slices.Equal(csr.DNSNames, []string{node}) || len(csr.IPAddresses) > 0 || len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return deny(ReasonMalformed, "the only subject alternative name must be the DNS name %q", node)
	}
	for _, u := range r.Usages {
		if !slices.Contains(migrationtls.Usages, u) && u != certificatesv1.UsageKeyEncipherment {
			return deny(ReasonMalformed, "usage %q is not one of a node certificate's (%v)", u, migrationtls.Usages)
		}
	}
	if !slices.Contains(r.Usages, certificatesv1.UsageServerAuth) || !slices.Contains(r.Usages, certificatesv1.UsageClientAuth) {
		return deny(ReasonMalformed, "a node certificate is for both server auth and client auth")
	}
	switch {
	case r.TokenNode != "" && r.TokenNode != node:
		return deny(ReasonNotThisNode, "%s speaks for node %s, not for node %s", r.Username, r.TokenNode, node)
	case r.TokenNode == node && r.Username == r.Agent:
	default:
		allowed, err := r.MayRequestForNode(node)
		if err != nil {
			return Decision{}, err
		}
		if !allowed && r.TokenNode == node {
			return deny(ReasonNotAuthorized, "%s is on node %s but is not lifeboat's agent (%s), and may not create lifeboat.dev nodecertificates %q", r.Username, node, r.Agent, node)
		}
		if !allowed {
			return deny(ReasonNotAuthorized, "%s has no token bound to node %s and may not create lifeboat.dev nodecertificates %q", r.Username, node, node)
		}
	}
	return Decision{Approve: true, Node: node, Reason: ReasonApproved, Message: "the requester speaks for node " + node}, nil
}
