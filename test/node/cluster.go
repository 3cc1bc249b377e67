package node

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
)

// maxNodes is how many nodes one process may start with StartN: they take the addresses
// 127.0.0.11 to 127.0.0.254.
const maxNodes = 244

// started numbers the nodes StartN starts, so that tests of one process, which share a
// control plane, never start two nodes of the same name or address.
var started atomic.Int32

// StartN starts n nodes for a test: node-1, node-2, … at 127.0.0.11, 127.0.0.12, …, numbered on
// across the calls of a process, each with its own root directory under t.TempDir() and logging
// to the test's log. configure, if given, adjusts each node's Config (binaries, grace periods,
// labels) before it starts. The nodes are stopped, and their Node objects deleted, when the
// test ends.
func StartN(ctx context.Context, t testing.TB, client kubernetes.Interface, n int, configure ...func(*Config)) []*Node {
	t.Helper()
	nodes := make([]*Node, 0, n)
	for range n {
		i := started.Add(1)
		if i > maxNodes {
			t.Fatalf("starting node %d: a process may start at most %d nodes", i, maxNodes)
		}
		cfg := Config{
			Client:  client,
			Name:    fmt.Sprintf("node-%d", i),
			Address: fmt.Sprintf("127.0.0.%d", 10+i),
			RootDir: t.TempDir(),
			Logger:  ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2))),
		}
		for _, f := range configure {
			f(&cfg)
		}
		node, err := Start(ctx, cfg)
		if err != nil {
			t.Fatalf("starting node %s: %v", cfg.Name, err)
		}
		t.Cleanup(func() {
			node.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := client.CoreV1().Nodes().Delete(ctx, node.Name(), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting node %s: %v", node.Name(), err)
			}
		})
		nodes = append(nodes, node)
	}
	return nodes
}

// NewTestNetwork makes a pod network for a test's nodes (Config.Network), removed when the
// test ends, after the nodes started later are stopped.
func NewTestNetwork(t testing.TB) *Network {
	t.Helper()
	n, err := NewNetwork(t.TempDir())
	if err != nil {
		t.Fatalf("making the pod network: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("removing the pod network: %v", err)
		}
	})
	return n
}

// OnNetwork puts StartN's nodes on the pod network n.
func OnNetwork(n *Network) func(*Config) { return func(c *Config) { c.Network = n } }

// StartTestServiceProxy runs kube-proxy on n for the test's Services
// (Network.StartServiceProxy); it is stopped when the test ends, and its log shown if the
// test failed.
func StartTestServiceProxy(t testing.TB, n *Network, binary, kubeconfig, nodeName string) *ServiceProxy {
	t.Helper()
	p, err := n.StartServiceProxy(binary, kubeconfig, nodeName)
	if err != nil {
		t.Fatalf("starting kube-proxy: %v", err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath)
			t.Logf("kube-proxy log:\n%s", b)
		}
	})
	return p
}
