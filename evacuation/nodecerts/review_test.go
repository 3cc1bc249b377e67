package nodecerts

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
)

func TestReview(t *testing.T) {
	good := func() *x509.CertificateRequest { return migrationtls.Template("node-a") }
	with := func(f func(*x509.CertificateRequest)) *x509.CertificateRequest { r := good(); f(r); return r }
	granted := func(nodes ...string) func(string) (bool, error) {
		return func(n string) (bool, error) {
			for _, g := range nodes {
				if g == n {
					return true, nil
				}
			}
			return false, nil
		}
	}
	usages := migrationtls.Usages
	cases := []struct {
		name      string
		user      string // the agent's when ""
		csr       *x509.CertificateRequest
		usages    []certificatesv1.KeyUsage
		tokenNode string
		rbac      func(string) (bool, error)
		approve   bool
		reason    string
		contains  string
	}{
		{name: "token bound to the node: approved", csr: good(), usages: usages, tokenNode: "node-a", rbac: granted(), approve: true},
		{name: "key encipherment as well: approved", csr: good(), usages: append([]certificatesv1.KeyUsage{certificatesv1.UsageKeyEncipherment}, usages...), tokenNode: "node-a", rbac: granted(), approve: true},
		{name: "token bound to another node: denied naming both", csr: good(), usages: usages, tokenNode: "node-b", rbac: granted("node-a"), reason: ReasonNotThisNode, contains: "speaks for node node-b, not for node node-a"},
		{name: "another account's token bound to the node (cert-manager's): denied", user: "system:serviceaccount:cert-manager:cert-manager", csr: good(), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonNotAuthorized,
			contains: "is on node node-a but is not lifeboat's agent (" + agent + ")"},
		{name: "another account's token bound to the node, RBAC grants that node: approved", user: "system:serviceaccount:ops:node-tool", csr: good(), usages: usages, tokenNode: "node-a", rbac: granted("node-a"), approve: true},
		{name: "no node in the token, RBAC grants that node: approved", csr: good(), usages: usages, rbac: granted("node-a"), approve: true},
		{name: "no node in the token, RBAC grants another node: denied", csr: good(), usages: usages, rbac: granted("node-b"), reason: ReasonNotAuthorized, contains: `nodecertificates "node-a"`},
		{name: "not a node's common name", csr: with(func(r *x509.CertificateRequest) { r.Subject.CommonName = "system:node:node-a" }), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed, contains: "common name"},
		{name: "empty node name", csr: with(func(r *x509.CertificateRequest) { r.Subject.CommonName = migrationtls.CommonName("") }), usages: usages, tokenNode: "", rbac: granted(""), reason: ReasonMalformed},
		{name: "another organization (a group the API server would believe)", csr: with(func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:masters"} }), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed, contains: "organization"},
		{name: "a second DNS name", csr: with(func(r *x509.CertificateRequest) { r.DNSNames = append(r.DNSNames, "kubernetes.default") }), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed, contains: "subject alternative name"},
		{name: "an IP address", csr: with(func(r *x509.CertificateRequest) { r.IPAddresses = []net.IP{net.ParseIP("10.0.0.1")} }), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed},
		{name: "another node's DNS name", csr: with(func(r *x509.CertificateRequest) { r.DNSNames = []string{"node-b"} }), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed},
		{name: "a CA usage", csr: good(), usages: append([]certificatesv1.KeyUsage{certificatesv1.UsageCertSign}, usages...), tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed, contains: "cert sign"},
		{name: "client auth only", csr: good(), usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed, contains: "both server auth and client auth"},
		{name: "different subject", csr: with(func(r *x509.CertificateRequest) { r.Subject = pkix.Name{CommonName: "admin"} }), usages: usages, tokenNode: "node-a", rbac: granted(), reason: ReasonMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			user := tc.user
			if user == "" {
				user = agent
			}
			d, err := Review(Request{CSR: tc.csr, Usages: tc.usages, Username: user, Agent: agent, TokenNode: tc.tokenNode, MayRequestForNode: tc.rbac})
			if err != nil {
				t.Fatal(err)
			}
			if d.Approve != tc.approve {
				t.Fatalf("approve = %v (%s: %s), want %v", d.Approve, d.Reason, d.Message, tc.approve)
			}
			if d.Approve && d.Node != "node-a" {
				t.Fatalf("approved for node %q, want node-a", d.Node)
			}
			if !d.Approve && (d.Reason != tc.reason || !strings.Contains(d.Message, tc.contains)) {
				t.Fatalf("denied with %s: %q; want reason %s and a message containing %q", d.Reason, d.Message, tc.reason, tc.contains)
			}
		})
	}
}

// agent is the agents' username, as installed from manifests/.
var agent = AgentUsername("lifeboat-system", "lifeboat-agent")

func TestReviewAsksRBACOnlyOfOthersThanTheNodesAgent(t *testing.T) {
	asked := false
	rbac := func(string) (bool, error) { asked = true; return false, errors.New("authorizer down") }
	if _, err := Review(Request{CSR: migrationtls.Template("node-a"), Usages: migrationtls.Usages, Username: agent, Agent: agent, TokenNode: "node-a", MayRequestForNode: rbac}); err != nil || asked {
		t.Fatalf("the agent's node-bound token asked RBAC (asked=%v, err=%v)", asked, err)
	}
	for _, r := range []Request{
		{Username: agent, Agent: agent},
		{Username: "system:serviceaccount:cert-manager:cert-manager", Agent: agent, TokenNode: "node-a"},
	} {
		r.CSR, r.Usages, r.MayRequestForNode = migrationtls.Template("node-a"), migrationtls.Usages, rbac
		if _, err := Review(r); err == nil {
			t.Fatalf("%s (token node %q): an authorizer error decided the request instead of being retried", r.Username, r.TokenNode)
		}
	}
}
