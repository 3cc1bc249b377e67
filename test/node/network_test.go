package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// netHelper is the command[0] of the pods of the network tests: this test binary, run as
//
//	net-helper serve PORT NAME   answer every connection on PORT with NAME and the pod's address
//	net-helper get ADDRESS       print what ADDRESS answers, and exit 0
func netHelper(args []string) int {
	switch {
	case len(args) == 3 && args[0] == "serve":
		l, err := net.Listen("tcp", ":"+args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("serving")
		for {
			c, err := l.Accept()
			if err != nil {
				return 1
			}
			fmt.Fprintf(c, "%s at %s\n", args[2], c.LocalAddr())
			c.Close()
		}
	case len(args) == 2 && args[0] == "get":
		c, err := net.DialTimeout("tcp", args[1], 10*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		_, err = io.Copy(os.Stdout, c)
		if err != nil {
			return 1
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "usage: net-helper serve PORT NAME | get ADDRESS")
	return 2
}

const netHelperCommand = "net-helper"

func helperPod(node *Node, name string, hostNetwork bool, args ...string) *corev1.Pod {
	p := shPod(node, name, "")
	p.Spec.HostNetwork = hostNetwork
	p.Spec.Containers[0].Command = []string{netHelperCommand}
	p.Spec.Containers[0].Args = args
	return p
}

// Pods on the pod network have their own address in their node's subnet, reach each other
// across nodes and are reached from the fabric; pods on the host's network keep the node's.
func TestPodNetwork(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	network := NewTestNetwork(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	withHelper := func(c *Config) { c.Binaries = map[string]string{netHelperCommand: self} }
	nodes := StartN(t.Context(), t, cluster.Kube, 2, OnNetwork(network), withHelper)

	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && isReady(p) }
	a := createPod(t, ns, helperPod(nodes[0], "server-a", false, "serve", "8080", "a"))
	b := createPod(t, ns, helperPod(nodes[1], "server-b", false, "serve", "8080", "b"))
	host := createPod(t, ns, helperPod(nodes[0], "host", true, "serve", "18080", "host"))
	a = waitForPod(t, ns, a.Name, "Running and Ready", running)
	b = waitForPod(t, ns, b.Name, "Running and Ready", running)
	host = waitForPod(t, ns, host.Name, "Running and Ready", running)

	addrs := map[string]netip.Addr{}
	for _, p := range []*corev1.Pod{a, b} {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !PodNetworkPrefix.Contains(ip) || p.Status.HostIP == p.Status.PodIP {
			t.Fatalf("pod %s: podIP %q, hostIP %q; want an address of its own in %s", p.Name, p.Status.PodIP, p.Status.HostIP, PodNetworkPrefix)
		}
		addrs[p.Name] = ip
	}
	if netip.PrefixFrom(addrs["server-a"], 24).Masked() == netip.PrefixFrom(addrs["server-b"], 24).Masked() {
		t.Errorf("pods on two nodes share a subnet: %s and %s; each node has its own", addrs["server-a"], addrs["server-b"])
	}
	if host.Status.PodIP != nodes[0].Address() {
		t.Errorf("a pod on the host's network has podIP %q, want the node's address %s", host.Status.PodIP, nodes[0].Address())
	}
	waitForLog(t, nodes[1], b, "main", "serving\n")

	// Pod to pod, across nodes.
	client := createPod(t, ns, helperPod(nodes[0], "client", false, "get", net.JoinHostPort(b.Status.PodIP, "8080")))
	client = waitForPod(t, ns, client.Name, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	waitForLog(t, nodes[0], client, "main", fmt.Sprintf("b at %s:8080\n", b.Status.PodIP))

	// From the fabric, as a client on a node.
	var answer string
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		answer, err = network.AskLine(ctx, net.JoinHostPort(a.Status.PodIP, "8080"), 2*time.Second)
		return err == nil, nil
	})
	if err != nil || !strings.HasPrefix(answer, "a at "+a.Status.PodIP) {
		t.Errorf("from the fabric, %s:8080 answered %q (%v); want server-a", a.Status.PodIP, answer, err)
	}
}

// A ClusterIP Service reaches its endpoints on both nodes, from the fabric and from a pod.
func TestServiceOnThePodNetwork(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	network := NewTestNetwork(t)
	proxy, err := controlplane.EnsureKubeProxy(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	withHelper := func(c *Config) { c.Binaries = map[string]string{netHelperCommand: self} }
	nodes := StartN(t.Context(), t, cluster.Kube, 2, OnNetwork(network), withHelper)
	StartTestServiceProxy(t, network, proxy, cluster.Kubeconfig, nodes[0].Name())

	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && isReady(p) }
	for i, name := range []string{"a", "b"} {
		p := helperPod(nodes[i], "server-"+name, false, "serve", "8080", name)
		p.Labels = map[string]string{"app": "echo"}
		p = createPod(t, ns, p)
		waitForPod(t, ns, p.Name, "Running and Ready", running)
	}
	svc, err := cluster.Kube.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	address := net.JoinHostPort(svc.Spec.ClusterIP, "80")

	// From the fabric: both endpoints answer, in turn, through the one address.
	seen := map[string]bool{}
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		answer, err := network.AskLine(ctx, address, 2*time.Second)
		if err != nil {
			return false, nil
		}
		if name, _, ok := strings.Cut(answer, " at "); ok {
			seen[name] = true
		}
		return seen["a"] && seen["b"], nil
	})
	if err != nil {
		t.Fatalf("through the Service %s, want answers from both server pods; had %v: %v", address, seen, err)
	}

	// From a pod, as its clients would.
	client := createPod(t, ns, helperPod(nodes[0], "client", false, "get", address))
	client = waitForPod(t, ns, client.Name, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	log, err := nodes[0].ContainerLog(client, "main")
	if err != nil || !strings.Contains(log, " at 10.244.") {
		t.Errorf("the client pod, through %s, got %q (%v); want a server pod's answer", address, log, err)
	}
}
