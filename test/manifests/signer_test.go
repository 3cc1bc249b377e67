package manifests

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/evacuation/nodecerts"
)

// TestOnlyTheSignerReadsTheMigrationCAKey: the migration CA's key, which makes any node's
// certificate, is read with each token of lifeboat's service accounts against the real API server
// and the shipped RBAC. Only the signer's gets it; the agent's (which every root on a VM node can
// read) and the controller's (which is also the eviction webhook's identity) are refused, and no
// account may list or watch the namespace's Secrets, which would return it by another way. The
// signer, run as manifests/signer.yaml runs it, signs a node's request with it.
func TestOnlyTheSignerReadsTheMigrationCAKey(t *testing.T) {
	objs := install(t)
	ctx := t.Context()
	if _, err := nodecerts.LoadOrCreateCA(ctx, cluster.Kube, "lifeboat-system"); err != nil {
		t.Fatal(err)
	}
	var accounts []string
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			accounts = append(accounts, o.GetName())
		}
	}
	if !strings.Contains(strings.Join(accounts, " "), signerSA) {
		t.Fatalf("manifests/ makes the service accounts %v, not %s", accounts, signerSA)
	}
	for _, sa := range append(accounts, "default") {
		secrets := tokenClient(t, sa, nil).CoreV1().Secrets("lifeboat-system")
		_, err := secrets.Get(ctx, nodecerts.CASecret, metav1.GetOptions{})
		switch {
		case sa == signerSA && err != nil:
			t.Errorf("the signer (%s) reading the migration CA's key: %v", sa, err)
		case sa != signerSA && !apierrors.IsForbidden(err):
			t.Errorf("%s reading Secret lifeboat-system/%s: %v, want Forbidden: only %s may", sa, nodecerts.CASecret, err, signerSA)
		}
		if _, err := secrets.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s listing lifeboat-system's Secrets: %v, want Forbidden", sa, err)
		}
		if w, err := secrets.Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			if w != nil {
				w.Stop()
			}
			t.Errorf("%s watching lifeboat-system's Secrets: %v, want Forbidden", sa, err)
		}
	}

	// The signer alone, with its own token and the controller's binary.
	startReplica(t, serviceAccountKubeconfig(t, signerSA), "signer", "--run=signer")
	node := createNode(t, "signer-node")
	if cond := requestFor(t, tokenClient(t, agentSA, node), node.Name); cond.Type != "Issued" {
		t.Errorf("the agent's request for its node's certificate ended %s (%s: %s), want it signed by lifeboat-controller --run=signer", cond.Type, cond.Reason, cond.Message)
	}
}
