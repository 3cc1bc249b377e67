package manifests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/nodecert"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/evacuation/nodecerts"
)

// createNode makes a Node object, which node-bound tokens name.
func createNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := cluster.Kube.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return n
}

// tokenFor is a token of lifeboat's service account sa; bound to node if node is not nil, as a
// pod's token on that node carries the node's name.
func tokenFor(t *testing.T, sa string, node *corev1.Node) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if node != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID}
	}
	token, err := cluster.Kube.CoreV1().ServiceAccounts("lifeboat-system").CreateToken(t.Context(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s: %v", sa, err)
	}
	return token.Status.Token
}

// tokenClient is a client with tokenFor(sa, node).
func tokenClient(t *testing.T, sa string, node *corev1.Node) kubernetes.Interface {
	t.Helper()
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = tokenFor(t, sa, node)
	return kubernetes.NewForConfigOrDie(cfg)
}

// runSigner runs lifeboat's signer with its own service account, as its pod would.
func runSigner(t *testing.T, maxLifetime time.Duration) {
	t.Helper()
	kube := tokenClient(t, signerSA, nil)
	ca, err := nodecerts.LoadOrCreateCA(t.Context(), kube, "lifeboat-system")
	if err != nil {
		t.Fatal(err)
	}
	informers := nodecerts.NewInformer(kube)
	c := nodecerts.New(kube, ca, nodecerts.AgentUsername("lifeboat-system", agentSA), informers.Certificates().V1().CertificateSigningRequests(), record.NewFakeRecorder(100), maxLifetime,
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(os.Stderr, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	informers.Start(ctx.Done())
	go func() { defer close(done); _ = c.Run(ctx, 1) }()
}

// TestAgentsGetCertificatesForTheirOwnNodeOnly runs the real signer and the agent's real
// certificate manager against the API server with the shipped RBAC: an agent whose token is
// bound to node A gets node A's certificate and renews it; a request for node A made with
// node B's token, or by a user RBAC grants no node, is denied with the reason.
func TestAgentsGetCertificatesForTheirOwnNodeOnly(t *testing.T) {
	install(t)
	const lifetime = 20 * time.Second
	runSigner(t, lifetime)
	nodeA, nodeB := createNode(t, "cert-node-a"), createNode(t, "cert-node-b")

	reg := prometheus.NewRegistry()
	certs, err := nodecert.Start(t.Context(), tokenClient(t, agentSA, nodeA), nodeA.Name, t.TempDir(), "lifeboat-system", reg)
	if err != nil {
		t.Fatal(err)
	}
	first := waitCertificate(t, certs, nil)
	if cn := first.Subject.CommonName; cn != migrationtls.CommonName(nodeA.Name) {
		t.Errorf("the certificate names %q, want %q", cn, migrationtls.CommonName(nodeA.Name))
	}
	roots, err := certs.Roots()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Verify(x509.VerifyOptions{Roots: roots, DNSName: nodeA.Name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node A's certificate does not verify against the published migration CA as node A's: %v", err)
	}
	if life := first.NotAfter.Sub(first.NotBefore); life > lifetime+lifetime/10+time.Second {
		t.Errorf("the certificate lives %s, want at most the signer's %s (and its backdating)", life, lifetime)
	}
	// Renewed before it expires, by the manager alone.
	renewed := waitCertificate(t, certs, first)
	if !renewed.NotAfter.After(first.NotAfter) {
		t.Errorf("the renewed certificate ends %s, not after the first's %s", renewed.NotAfter, first.NotAfter)
	}
	if n := renewals(t, reg); n < 1 {
		t.Errorf("lifeboat_agent_migration_certificate_age_at_renewal_seconds counted %d renewals, want the one seen", n)
	}

	t.Run("node B's token asks for node A's certificate: denied", func(t *testing.T) {
		cond := requestFor(t, tokenClient(t, agentSA, nodeB), nodeA.Name)
		if cond.Type != certificatesv1.CertificateDenied || cond.Reason != nodecerts.ReasonNotThisNode ||
			!strings.Contains(cond.Message, "speaks for node cert-node-b, not for node cert-node-a") {
			t.Errorf("the request ended %s (%s: %s), want Denied (%s) naming both nodes", cond.Type, cond.Reason, cond.Message, nodecerts.ReasonNotThisNode)
		}
	})
	t.Run("another service account's token bound to node A asks for node A's certificate: denied", func(t *testing.T) {
		// Any pod on the node has such a token; cert-manager's, a mesh's or SPIRE's may create CSRs.
		const sa = "csr-creator"
		csrCreator(t, sa)
		cond := requestFor(t, tokenClient(t, sa, nodeA), nodeA.Name)
		if cond.Type != certificatesv1.CertificateDenied || cond.Reason != nodecerts.ReasonNotAuthorized ||
			!strings.Contains(cond.Message, "is on node cert-node-a but is not lifeboat's agent (system:serviceaccount:lifeboat-system:lifeboat-agent)") {
			t.Errorf("the request ended %s (%s: %s), want Denied (%s) saying it is not lifeboat's agent", cond.Type, cond.Reason, cond.Message, nodecerts.ReasonNotAuthorized)
		}
	})
	t.Run("the agent's token bound to no node: denied", func(t *testing.T) {
		cond := requestFor(t, tokenClient(t, agentSA, nil), nodeA.Name)
		if cond.Type != certificatesv1.CertificateDenied || cond.Reason != nodecerts.ReasonNotAuthorized {
			t.Errorf("the request ended %s (%s: %s), want Denied (%s)", cond.Type, cond.Reason, cond.Message, nodecerts.ReasonNotAuthorized)
		}
	})
}

// csrCreator makes the service account sa in lifeboat-system, which may create certificate
// signing requests and read them back, as cert-manager's may.
func csrCreator(t *testing.T, sa string) {
	t.Helper()
	ctx := t.Context()
	if _, err := cluster.Kube.CoreV1().ServiceAccounts("lifeboat-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{certificatesv1.GroupName}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get", "list", "watch"},
	}}}
	if _, err := cluster.Kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sa},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "lifeboat-system", Name: sa}}}
	if _, err := cluster.Kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cluster.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, sa, metav1.DeleteOptions{})
		_ = cluster.Kube.RbacV1().ClusterRoles().Delete(ctx, sa, metav1.DeleteOptions{})
		_ = cluster.Kube.CoreV1().ServiceAccounts("lifeboat-system").Delete(ctx, sa, metav1.DeleteOptions{})
	})
	// The authorizer sees a new binding a moment after it is stored.
	client := tokenClient(t, sa, nil)
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
}

// renewals is how many renewals the agent's metrics counted.
func renewals(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "lifeboat_agent_migration_certificate_age_at_renewal_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// waitCertificate waits for the manager's certificate other than old.
func waitCertificate(t *testing.T, certs *nodecert.Certificates, old *x509.Certificate) *x509.Certificate {
	t.Helper()
	var got *x509.Certificate
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if c := certs.Current(); c != nil && (old == nil || c.Leaf.SerialNumber.Cmp(old.SerialNumber) != 0) {
			got = c.Leaf
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no new certificate from the signer within a minute (had one: %v)", old != nil)
	}
	return got
}

// requestFor makes a request for node's certificate with kube, as an agent would, and returns
// the condition that ends it.
func requestFor(t *testing.T, kube kubernetes.Interface, node string) certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, migrationtls.Template(node), key)
	if err != nil {
		t.Fatal(err)
	}
	pemReq := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	name, _, err := csr.RequestCertificateWithContext(t.Context(), kube, pemReq, "", migrationtls.SignerName, nil, migrationtls.Usages, key)
	if err != nil {
		t.Fatal(err)
	}
	var cond certificatesv1.CertificateSigningRequestCondition
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := cluster.Kube.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
				cond = c
				return true, nil
			}
		}
		if len(got.Status.Certificate) > 0 {
			cond = certificatesv1.CertificateSigningRequestCondition{Type: "Issued"}
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("request %s was neither signed nor refused within 30s: %v", name, err)
	}
	return cond
}
