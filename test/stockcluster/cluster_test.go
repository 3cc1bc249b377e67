package stockcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
)

// stock is a cluster with upstream defaults and lifeboat installed as the README says.
type stock struct {
	cp *controlplane.ControlPlane
	// bin holds kubectl-lifeboat, the kubectl plugin the README has users build.
	bin   string
	nodes []*realnode.Node
	// registry is the registry's host:port; guestKernel and guestDisk the test guest's images there.
	registry, guestKernel, guestDisk string
	// installDir holds lifeboat-install/, the README's overlay, as the user keeps it for upgrades.
	installDir string
}

// profile is how the cluster is set up.
type profile struct {
	name string
	// stock: the API server and the kubelets as upstream has them (the package's doc); otherwise
	// as the other tests have them for lifeboat: the API server presents its webhook client
	// certificate and serves the EvictionRequest API, the kubelets have evictionSoft
	// memory.available<1Gi for 5 s and evictionMaxPodGracePeriod 60 (test/realnode's defaults).
	stock bool
}

var (
	stockProfile      = profile{name: "stock", stock: true}
	configuredProfile = profile{name: "configured"}
)

// nodeAddresses are the two VM nodes' addresses; each kubelet listens on its own at 10250, the
// default port, which lifeboat's agent asks.
var nodeAddresses = []string{"127.0.0.41", "127.0.0.42"}

// controlNode is the node that runs no VMs, where lifeboat's controller and signer go (their
// node affinity keeps them off VM nodes), as a cluster's control-plane or infrastructure nodes do.
var controlNode = struct{ name, address string }{"stock-control", "127.0.0.43"}

// startStock brings the cluster up and installs lifeboat; cleanup removes everything.
func startStock(t testing.TB, p profile) *stock {
	t.Helper()
	ctx := t.Context()
	cp, err := controlplane.Start(ctx, controlplane.Options{Stock: p.stock, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	s := &stock{cp: cp, bin: t.TempDir()}
	if err := (controlplane.GoBuild{Out: filepath.Join(s.bin, "kubectl-lifeboat"), Packages: []string{"./cmd/kubectl-lifeboat"}}).Run(ctx); err != nil {
		t.Fatal(err)
	}

	// The registry, in this process, on loopback; containerd is told to speak plain HTTP to it
	// (its hosts.toml: node configuration, as any registry without TLS needs).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.registry = l.Addr().String()
	hosts := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hosts, s.registry), 0o755); err != nil {
		t.Fatal(err)
	}
	hostsToml := fmt.Sprintf("server = %[1]q\n[host.%[1]q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+s.registry)
	if err := os.WriteFile(filepath.Join(hosts, s.registry, "hosts.toml"), []byte(hostsToml), 0o644); err != nil {
		t.Fatal(err)
	}

	// make push REGISTRY=<registry>/lifeboat TAG=<tag>, by the code make push runs.
	tag := fmt.Sprintf("t%d", time.Now().Unix())
	pushed, err := images.Push(ctx, s.registry+"/lifeboat", tag, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	s.pushGuest(t)

	// The harness reads the kubelets' summaries as the cluster's admin: a default kubelet lets no
	// anonymous caller in.
	reader, err := tls.X509KeyPair(cp.Config.CertData, cp.Config.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	network := node.NewTestNetwork(t)
	type nodeSpec struct {
		name, address string
		labels        map[string]string
	}
	nodes := []nodeSpec{{controlNode.name, controlNode.address, nil}}
	for i, addr := range nodeAddresses {
		nodes = append(nodes, nodeSpec{fmt.Sprintf("stock-%d", i+1), addr, map[string]string{node.KVMLabel: "true"}})
	}
	for _, spec := range nodes {
		n, err := realnode.Start(ctx, realnode.Config{
			Name: spec.name, Address: spec.address, Kubeconfig: cp.Kubeconfig, Client: cp.Kube,
			Labels: spec.labels, Progress: os.Stderr, Network: network,
			OwnCgroupRoot: true, StandardPaths: true, RegistryHosts: hosts, KubeletReader: &reader,
			Kubelet: func(c *kubeletv1beta1.KubeletConfiguration) {
				if p.stock {
					stockKubelet(c, cp.CAFile(), nil)
				} else {
					c.Port = 10250
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if spec.labels != nil {
			s.nodes = append(s.nodes, n)
		}
		t.Cleanup(func() {
			if t.Failed() {
				keepLogs(t, n)
			}
			n.Stop()
		})
	}
	s.install(t, pushed, tag)
	return s
}

// stockKubelet is the kubelet's upstream default eviction configuration, but for the disk
// thresholds (see the package's doc) and a hard memory.available threshold hard may raise, and
// its default authentication and authorization (no anonymous caller; client certificates of the
// cluster CA, as the API server's, and bearer tokens checked by the API server, as the agent's;
// each request authorized by the API server), where the harness's other nodes let anyone in.
func stockKubelet(c *kubeletv1beta1.KubeletConfiguration, clientCA string, hard *string) {
	f, t := false, true
	c.Authentication = kubeletv1beta1.KubeletAuthentication{
		Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: &f},
		Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: &t},
		X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: clientCA},
	}
	c.Authorization = kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook}
	c.Port = 10250
	c.EvictionSoft = nil
	c.EvictionSoftGracePeriod = nil
	c.EvictionMaxPodGracePeriod = 0
	c.EvictionPressureTransitionPeriod = metav1.Duration{}
	threshold := "100Mi"
	if hard != nil {
		threshold = *hard
	}
	c.EvictionHard = map[string]string{"memory.available": threshold}
}

// pushGuest pushes the test guest's kernel and disk images to the registry, as a user pushes the
// images their VMs boot from.
func (s *stock) pushGuest(t testing.TB) {
	t.Helper()
	g, err := guest.Ensure(t.Context(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := images.GuestImages(g)
	if err != nil {
		t.Fatal(err)
	}
	for ref, img := range imgs {
		short := ref[strings.LastIndex(ref, "/")+1:]
		to, err := name.NewTag(s.registry + "/guests/" + short)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(to, img, remote.WithContext(t.Context())); err != nil {
			t.Fatal(err)
		}
		switch ref {
		case images.GuestKernelImage:
			s.guestKernel = to.String()
		case images.GuestDiskImage:
			s.guestDisk = to.String()
		}
	}
}

// installOverlay is the README's overlay (section "Install on a cluster") with this registry and
// tag; the test adds only the component this machine needs (see the package's doc).
const installOverlay = `resources:
- %[1]s
images:
- {name: lifeboat.dev/lifeboat-agent, newName: %[2]s/lifeboat-agent, newTag: %[3]s}
- {name: lifeboat.dev/lifeboat-controller, newName: %[2]s/lifeboat-controller, newTag: %[3]s}
- {name: lifeboat.dev/lifeboat-launcher, newName: %[2]s/lifeboat-launcher, newTag: %[3]s}
`

// install runs the README's steps: the overlay, the apply command, kubectl lifeboat check.
func (s *stock) install(t testing.TB, pushed map[string]string, tag string) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf(installOverlay, "../manifests", "$REGISTRY", "$TAG"), applyCommand} {
		if !strings.Contains(string(readme), want) {
			t.Fatalf("the README's install section no longer says what this test runs:\n%s", want)
		}
	}
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(root, "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	component, err := os.ReadFile(filepath.Join(root, "test", "stockcluster", "no-service-network", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	apiPort := s.cp.Host[strings.LastIndex(s.cp.Host, ":")+1:]
	if err := os.MkdirAll(filepath.Join(dir, "no-service-network"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "no-service-network", "kustomization.yaml"), []byte(strings.ReplaceAll(string(component), "API_PORT", apiPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := fmt.Sprintf(installOverlay, base, s.registry+"/lifeboat", tag) + "components:\n- no-service-network\n"
	installDir := filepath.Join(dir, "lifeboat-install")
	if err := os.MkdirAll(installDir, 0o755); err != nil {
		t.Fatal(err)
	}
	overlay = strings.Replace(overlay, base, filepath.Join("..", base), 1)
	overlay = strings.Replace(overlay, "- no-service-network", "- ../no-service-network", 1)
	if err := os.WriteFile(filepath.Join(installDir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, ref := range pushed {
		t.Logf("pushed %s as %s", name, ref)
	}
	s.installDir = dir
	s.shell(t, dir, applyCommand, 5*time.Minute)
	for _, app := range []string{"lifeboat-agent", "lifeboat-controller", "lifeboat-signer"} {
		s.waitReady(t, "app.kubernetes.io/name="+app, map[string]int{"lifeboat-agent": 2, "lifeboat-controller": 1, "lifeboat-signer": 1}[app])
	}
}

// applyCommand is the README's one apply command, run in the directory holding lifeboat-install/.
const applyCommand = `kubectl apply --server-side -k lifeboat-install/ || { kubectl wait --for condition=Established crd -l app.kubernetes.io/part-of=lifeboat && kubectl apply --server-side -k lifeboat-install/; }`

// shell runs a command line with kubectl on PATH and the admin kubeconfig, as a user would.
func (s *stock) shell(t testing.TB, dir, line string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	return s.shellContext(ctx, t, dir, line)
}

// shellContext is shell within ctx, for a cleanup (when t's context has ended).
func (s *stock) shellContext(ctx context.Context, t testing.TB, dir, line string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.cp.Kubeconfig, "PATH="+s.bin+":"+filepath.Dir(s.cp.Binaries.Kubectl)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	t.Logf("$ %s\n%s", line, lastLines(string(out), shownLines))
	return string(out)
}

// shownLines bounds what a test's log shows of a command's output or of a node's logs: a failed
// run's messages must stay near the end of what CI keeps of it, below the logs.
const shownLines = 20

// keepLogs writes a failed test's node logs (every container's, the kubelet's and containerd's
// tails) to files that outlive the run, and shows only where they are and the kubelet's last lines.
func keepLogs(t testing.TB, n *realnode.Node) {
	dir, err := os.MkdirTemp("", "lifeboat-stockcluster-"+n.Name()+"-")
	if err != nil {
		t.Logf("keeping %s's logs: %v", n.Name(), err)
		return
	}
	files := map[string]string{"kubelet.log": n.LogTail("kubelet"), "containerd.log": n.LogTail("containerd")}
	for pod, log := range n.ContainerLogs(1000) {
		files[strings.ReplaceAll(pod, "/", "_")+".log"] = log
	}
	for name, log := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(log), 0o644); err != nil {
			t.Logf("keeping %s's logs: %v", n.Name(), err)
		}
	}
	t.Logf("%s: its container, kubelet and containerd logs are in %s; the kubelet's last lines:\n%s", n.Name(), dir, lastLines(n.LogTail("kubelet"), shownLines))
}

// lastLines is the end of s, at most n lines, saying how many it left out.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) <= n {
		return strings.Join(l, "\n")
	}
	return fmt.Sprintf("[%d lines before]\n%s", len(l)-n, strings.Join(l[len(l)-n:], "\n"))
}

// waitReady waits for count Ready pods of lifeboat's with the selector.
func (s *stock) waitReady(t testing.TB, selector string, count int) {
	t.Helper()
	kubewait.For(t, 5*time.Minute, fmt.Sprintf("%d Ready pods %s", count, selector), func(ctx context.Context) (*corev1.PodList, error) {
		return s.cp.Kube.CoreV1().Pods("lifeboat-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
	}, func(l *corev1.PodList) bool {
		ready := 0
		for _, p := range l.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == count
	}, func(l *corev1.PodList) string {
		var b strings.Builder
		for _, p := range l.Items {
			fmt.Fprintf(&b, "%s on %s: %s %+v; ", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
		}
		return b.String()
	})
}
