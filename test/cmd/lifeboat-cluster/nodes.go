package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// defaultNodesRoot holds the emulated nodes' private host paths. It is short on purpose: the
// launchers' libvirt sockets live under it, and a unix socket path may not exceed 107 bytes.
const defaultNodesRoot = "/tmp/lifeboat-demo"

// maxSocketPath is the longest unix socket path Linux takes (sun_path less its terminating NUL).
const maxSocketPath = 107

// nodesRootFile records, in the cluster's directory, the nodes root serve was given, for the
// commands (console) that read the nodes' files later.
const nodesRootFile = "nodes-root"

// maxPodGracePeriod is the emulated kubelets' evictionMaxPodGracePeriod, which their agents are told.
const maxPodGracePeriod = 60

// lifeboatOptions say how to run lifeboat on the demo cluster.
type lifeboatOptions struct {
	nodes        int
	bin          string // directory with lifeboat-agent, lifeboat-controller, lifeboat-launcher
	acceleration string
	nodesRoot    string
}

// readNodesRoot returns the nodes root of the cluster in dir.
func readNodesRoot(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, nodesRootFile))
	if err != nil {
		return "", fmt.Errorf("no emulated nodes run from %s: %w", dir, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// startLifeboat starts the emulated nodes, an agent on each, and the controller; stop ends them.
func startLifeboat(ctx context.Context, cp *controlplane.ControlPlane, o lifeboatOptions) (nodes []*node.Node, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		_ = os.RemoveAll(o.nodesRoot)
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	// The longest socket a node holds: a migration's, in a launcher's directory.
	longest := filepath.Join(o.nodesRoot, fmt.Sprintf("node-%d", o.nodes), "run/lifeboat/domains", uuid.NewString(), "migration-libvirt.sock")
	if len(longest) > maxSocketPath {
		return nil, stop, fmt.Errorf("--nodes-root %s is too long: the nodes' unix sockets, such as %s, would exceed %d bytes", o.nodesRoot, longest, maxSocketPath)
	}
	if err := os.RemoveAll(o.nodesRoot); err != nil {
		return nil, stop, err
	}
	if err := os.WriteFile(filepath.Join(cp.Dir, nodesRootFile), []byte(o.nodesRoot), 0o644); err != nil {
		return nil, stop, err
	}
	// The nodes pull the test guest's images (its kernel, a containerDisk) from a store of their own.
	store := filepath.Join(o.nodesRoot, "images")
	if err := writeGuestImages(ctx, store); err != nil {
		return nil, stop, err
	}
	// The controller runs as a cluster admin deploys it: with the eviction webhook (so drains and the
	// descheduler meet lifeboat), the disruption budgets and the EvictionRequest responder.
	hook, err := freeAddress("127.0.0.1")
	if err != nil {
		return nil, stop, err
	}
	metrics, err := freeAddress("127.0.0.1")
	if err != nil {
		return nil, stop, err
	}
	controller, err := startChild(cp.Dir, filepath.Join(o.bin, "lifeboat-controller"),
		"--kubeconfig", cp.Kubeconfig, "--acceleration", o.acceleration,
		// As the Deployment runs it: the Lease says who leads (kubectl lifeboat check reads it).
		"--leader-elect",
		"--webhook-listen", hook, "--webhook-url", "https://"+hook+webhook.Path, "--webhook-client-ca", cp.CAFile(), "--metrics-listen", metrics, "--metrics-insecure")
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, controller)
	// The nodes' pods are on a pod network of their own, with kube-proxy routing Services.
	network, err := node.NewNetwork(filepath.Join(o.nodesRoot, networkDir))
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, func() { _ = network.Close() })
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, stop, err
	}
	for i := 1; i <= o.nodes; i++ {
		name, addr := fmt.Sprintf("node-%d", i), fmt.Sprintf("127.0.0.%d", 10+i)
		n, err := node.Start(ctx, node.Config{
			Client: cp.Kube, Name: name, Address: addr, RootDir: filepath.Join(o.nodesRoot, name),
			Capacity: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")},
			Binaries: map[string]string{"lifeboat-launcher": filepath.Join(o.bin, "lifeboat-launcher")},
			Images:   store,
			Network:  network,
			// What the agent's device plugin serves on a node that has the device.
			Devices:                   map[corev1.ResourceName]string{v1alpha1.DeviceTun: "/dev/net/tun"},
			EvictionMaxPodGracePeriod: maxPodGracePeriod,
			Logger:                    klog.Background().WithValues("node", name),
		})
		if err != nil {
			return nil, stop, fmt.Errorf("starting node %s: %w", name, err)
		}
		stops = append(stops, n.Stop)
		nodes = append(nodes, n)
		listen, err := freeAddress(addr)
		if err != nil {
			return nil, stop, err
		}
		agent, err := startChild(cp.Dir, filepath.Join(o.bin, "lifeboat-agent"), "--kubeconfig", cp.Kubeconfig,
			"--node-name", name, "--node-address", addr, "--run-dir", n.HostPath("/var/run/lifeboat"), "--listen", listen,
			"--kubelet-pods-dir", n.HostPath("/var/lib/kubelet/pods"), "--cert-dir", filepath.Join(n.HostPath("/var/run/lifeboat"), "pki"),
			"--eviction-max-pod-grace-period", strconv.Itoa(maxPodGracePeriod),
			// Emulated nodes have no kubelet device manager to register with.
			"--device-plugin-dir=")
		if err != nil {
			return nil, stop, err
		}
		stops = append(stops, agent)
		// As lifeboat-qemu-probe's DaemonSet would: the node's QEMU probed once, for every launcher on it.
		if err := n.StartQEMUProbe(ctx, filepath.Join(root, "manifests", "qemu-probe.yaml")); err != nil {
			return nil, stop, err
		}
	}
	kubeProxy, err := controlplane.EnsureKubeProxy(ctx, os.Stderr)
	if err != nil {
		return nil, stop, err
	}
	proxy, err := network.StartServiceProxy(kubeProxy, cp.Kubeconfig, nodes[0].Name())
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, proxy.Stop)
	return nodes, stop, nil
}

// networkDir holds the pod network's state, under the nodes root.
const networkDir = "network"

// freeAddress returns host:port with a port free on host now, so that a demo cluster and the
// tests' clusters can run side by side.
func freeAddress(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startChild runs a lifeboat binary with its log in dir; the returned function stops it.
func startChild(dir, path string, args ...string) (func(), error) {
	name := filepath.Base(path)
	for i := 0; i < len(args)-1; i++ {
		if args[i] == "--node-name" {
			name += "-" + args[i+1]
		}
	}
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s (run make demo, which builds it): %w", path, err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
	}, nil
}

// writeGuestImages writes the test guest's images into the OCI image layout at store.
func writeGuestImages(ctx context.Context, store string) error {
	g, err := guest.Ensure(ctx, os.Stderr)
	if err != nil {
		return err
	}
	imgs, err := images.GuestImages(g)
	if err != nil {
		return err
	}
	return images.WriteStore(store, imgs)
}
