package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// TestNodeStaysReady watches a node for longer than kube-controller-manager's
// node-monitor-grace-period (40s): without heartbeats, the node lifecycle controller would
// mark it NotReady and taint it.
func TestNodeStaysReady(t *testing.T) {
	t.Parallel()
	const watchFor = 60 * time.Second
	node := startNodes(t, 1)[0]

	// The API server taints every new Node not-ready (admission plugin TaintNodesByCondition);
	// the node lifecycle controller lifts the taint once it sees the node Ready.
	kubewait.For(t, waitTimeout, "node "+node.Name()+" Ready and untainted after registering", func(ctx context.Context) (*corev1.Node, error) {
		return cluster.Kube.CoreV1().Nodes().Get(ctx, node.Name(), metav1.GetOptions{})
	}, func(n *corev1.Node) bool { return nodeHealthy(n) == "" }, nodeHealthy)

	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	for deadline := time.Now().Add(watchFor); time.Now().Before(deadline); <-ticker.C {
		n, err := cluster.Kube.CoreV1().Nodes().Get(t.Context(), node.Name(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the node: %v", err)
		}
		if problem := nodeHealthy(n); problem != "" {
			t.Fatalf("node %s, %s after registering: %s", n.Name, time.Since(n.CreationTimestamp.Time).Round(time.Second), problem)
		}
	}
	if age := time.Since(waitForLease(t, node).Spec.RenewTime.Time); age > 2*nodeLeaseRenewInterval {
		t.Errorf("the lease was last renewed %s ago, want at most %s", age, 2*nodeLeaseRenewInterval)
	}
}

// waitForLease waits for the node's Lease in kube-node-lease, held and owned by the node.
func waitForLease(t *testing.T, node *Node) *coordinationv1.Lease {
	t.Helper()
	return kubewait.For(t, waitTimeout, "node "+node.Name()+"'s lease held, renewed and owned by the Node", func(ctx context.Context) (*coordinationv1.Lease, error) {
		return cluster.Kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node.Name(), metav1.GetOptions{})
	}, func(lease *coordinationv1.Lease) bool {
		owned := len(lease.OwnerReferences) == 1 && lease.OwnerReferences[0].Kind == "Node" && lease.OwnerReferences[0].Name == node.Name()
		held := lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == node.Name()
		return owned && held && lease.Spec.RenewTime != nil
	}, nil)
}

// nodeHealthy says what is wrong with n for the scheduler, or "" if nothing is.
func nodeHealthy(n *corev1.Node) string {
	if n == nil {
		return "never read"
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message)
		}
	}
	if len(n.Spec.Taints) > 0 {
		return fmt.Sprintf("tainted %v", n.Spec.Taints)
	}
	return ""
}

// A frozen node (Freeze) renews no Lease and posts no status, so the node lifecycle controller
// marks it NotReady after its grace period; thawed, it is Ready again.
func TestAFrozenNodeGoesNotReadyAndComesBack(t *testing.T) {
	t.Parallel()
	node := startNodes(t, 1)[0]
	get := func(ctx context.Context) (*corev1.Node, error) {
		return cluster.Kube.CoreV1().Nodes().Get(ctx, node.Name(), metav1.GetOptions{})
	}
	kubewait.For(t, waitTimeout, "node "+node.Name()+" Ready and untainted", get, func(n *corev1.Node) bool { return nodeHealthy(n) == "" }, nodeHealthy)
	node.Freeze()
	frozenAt := time.Now()
	kubewait.For(t, 3*time.Minute, "node "+node.Name()+" NotReady while frozen", get,
		func(n *corev1.Node) bool { return nodeHealthy(n) != "" && !nodeReady(n) }, nodeHealthy)
	if renewed := waitForLease(t, node).Spec.RenewTime.Time; renewed.After(frozenAt.Add(time.Second)) {
		t.Errorf("a frozen node renewed its lease at %s, frozen at %s", renewed, frozenAt)
	}
	node.Thaw()
	kubewait.For(t, 3*time.Minute, "node "+node.Name()+" Ready and untainted once thawed", get, func(n *corev1.Node) bool { return nodeHealthy(n) == "" }, nodeHealthy)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
