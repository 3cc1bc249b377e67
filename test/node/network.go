package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
)

// CNIBinDir is where Debian's containernetworking-plugins puts the plugins.
const CNIBinDir = "/usr/lib/cni"

// Network is the pod network of the emulated nodes of a process, wired as a kubelet's runtime
// wires one through CNI: every pod that is not on the host's network gets its own network
// namespace, and the containernetworking-plugins bridge plugin, with host-local IPAM, joins it
// to its node's bridge. The bridges live in one network namespace the harness makes, the
// fabric, where each node's pod subnet (10.244.<n>.0/24) is a connected route: pods on
// different nodes reach each other through it, and nothing reaches the machine's own network.
type Network struct {
	dir    string
	fabric string // the fabric namespace, bind-mounted here
	cni    *libcni.CNIConfig

	mu    sync.Mutex
	nodes int
}

// PodNetworkPrefix holds every node's pod subnet.
var PodNetworkPrefix = netip.MustParsePrefix("10.244.0.0/16")

// NewNetwork makes the fabric; its state (namespaces, the plugins' caches and address
// allocations) lives in dir, which it takes over: namespaces an earlier run that crashed left
// there are removed first. Close removes the fabric.
func NewNetwork(dir string) (*Network, error) {
	if stale, err := os.ReadDir(filepath.Join(dir, "netns")); err == nil {
		for _, e := range stale {
			if err := removeNetNS(filepath.Join(dir, "netns", e.Name())); err != nil {
				return nil, fmt.Errorf("removing a network namespace an earlier run left: %w", err)
			}
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if err := checkExecutable(filepath.Join(CNIBinDir, plugin)); err != nil {
			return nil, fmt.Errorf("the CNI plugin %s (Debian's containernetworking-plugins): %w", plugin, err)
		}
	}
	for _, d := range []string{"netns", "cni-cache", "ipam"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	n := &Network{dir: dir, fabric: filepath.Join(dir, "netns", "fabric")}
	if err := newNetNS(n.fabric); err != nil {
		return nil, fmt.Errorf("making the fabric's network namespace: %w", err)
	}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{CNIBinDir}, filepath.Join(dir, "cni-cache"), nil)
	if err := n.Do(fabricRoutes); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// fabricRoutes brings the fabric's loopback up and gives it a default route into a veth pair
// whose both ends are the fabric's, so nothing leaves: a connection from the fabric to a
// Service address needs a route before kube-proxy's rules rewrite its destination, as on a node
// with a default route.
func fabricRoutes() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	sink := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lb-sink"}, PeerName: "lb-sink-peer"}
	if err := netlink.LinkAdd(sink); err != nil {
		return fmt.Errorf("adding the fabric's default route device: %w", err)
	}
	for _, name := range []string{"lb-sink", "lb-sink-peer"} {
		l, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			return err
		}
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: sink.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
}

// OpenNetwork is the network another process made in dir (NewNetwork), to connect from its
// fabric as a client on a node would; it cannot start nodes.
func OpenNetwork(dir string) (*Network, error) {
	n := &Network{dir: dir, fabric: filepath.Join(dir, "netns", "fabric")}
	var st unix.Statfs_t
	if err := unix.Statfs(n.fabric, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("no pod network in %s: %s is not a network namespace (%v)", dir, n.fabric, err)
	}
	return n, nil
}

// Close removes the fabric. The nodes that used it must have stopped.
func (n *Network) Close() error { return removeNetNS(n.fabric) }

// Do runs fn on a thread in the fabric's namespace: a socket it opens is the fabric's (a
// client on the cluster's network, as on a node), and so are processes it starts.
func (n *Network) Do(fn func() error) error { return inNetNS(n.fabric, fn) }

// DialContext connects from the fabric, as a client on a node would.
func (n *Network) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var conn net.Conn
	err := n.Do(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// AskLine connects to address (TCP) from the fabric, as a client on a node would, and reads one
// line of its answer; the connection and the answer have timeout each.
func (n *Network) AskLine(ctx context.Context, address string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := n.DialContext(ctx, "tcp", address)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	return bufio.NewReader(c).ReadString('\n')
}

// node assigns the next node its pod subnet and bridge.
func (n *Network) node() (nodeNetwork, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes++
	if n.nodes > 254 {
		return nodeNetwork{}, errors.New("the pod network has room for 254 nodes")
	}
	subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(n.nodes), 0}), 24)
	return nodeNetwork{net: n, subnet: subnet, bridge: fmt.Sprintf("lbnode%d", n.nodes)}, nil
}

// nodeNetwork is one node's share of the pod network.
type nodeNetwork struct {
	net    *Network
	subnet netip.Prefix
	bridge string
}

func (nn nodeNetwork) conflist() (*libcni.NetworkConfigList, error) {
	b, err := nn.conflistJSON("bridge")
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}

// conflistJSON is the node's CNI configuration, with plugin the bridge plugin's name.
func (nn nodeNetwork) conflistJSON(plugin string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "lifeboat-pods",
		"plugins": []any{map[string]any{
			"type": plugin, "bridge": nn.bridge, "isGateway": true, "hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": nn.subnet.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(nn.net.dir, "ipam"),
			},
		}},
	}
	return json.Marshal(conf)
}

// fabricBridge is the name of the plugin RuntimeCNI writes: the bridge plugin, run in the fabric.
const fabricBridge = "fabric-bridge"

// RuntimeCNI gives a container runtime other than the emulated nodes' (a real node's containerd)
// the next node's share of the network: it writes the CNI configuration into confDir and, into
// binDir, the plugin it names, which runs the bridge plugin in the fabric as the emulated nodes
// do (nsenter), so that the node's bridge is the fabric's and nothing is added to the machine's
// own network. The runtime's plugin path must be binDir, then CNIBinDir. It returns the node's
// pod subnet.
func (n *Network) RuntimeCNI(confDir, binDir string) (netip.Prefix, error) {
	nn, err := n.node()
	if err != nil {
		return netip.Prefix{}, err
	}
	conf, err := nn.conflistJSON(fabricBridge)
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-lifeboat-pods.conflist"), conf, 0o644); err != nil {
		return netip.Prefix{}, err
	}
	script := fmt.Sprintf("#!/bin/sh\n# The bridge plugin, in the pod network's fabric (lifeboat test/node.Network).\nexec nsenter --net=%s %s\n",
		n.fabric, filepath.Join(CNIBinDir, "bridge"))
	return nn.subnet, os.WriteFile(filepath.Join(binDir, fabricBridge), []byte(script), 0o755)
}

var loopbackConf = []byte(`{"cniVersion": "1.0.0", "name": "lifeboat-loopback", "plugins": [{"type": "loopback"}]}`)

// podSandbox is a pod's network namespace and address.
type podSandbox struct {
	namespace, name, uid string
	netns                string
	ip                   string
}

func (sb *podSandbox) runtimeConf(ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: sb.uid, NetNS: sb.netns, IfName: ifName,
		// As containerd passes them: plugins that do not know the Kubernetes arguments ignore them.
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", sb.namespace}, {"K8S_POD_NAME", sb.name}, {"K8S_POD_UID", sb.uid}},
	}
}

// attach makes pod's network namespace and has the plugins wire it, as a runtime does when it
// creates a pod's sandbox. The plugins run in the fabric, where they make the node's bridge.
func (nn nodeNetwork) attach(ctx context.Context, pod *corev1.Pod) (*podSandbox, error) {
	path := filepath.Join(nn.net.dir, "netns", string(pod.UID))
	sb := &podSandbox{namespace: pod.Namespace, name: pod.Name, uid: string(pod.UID), netns: path}
	if err := newNetNS(path); err != nil {
		return nil, fmt.Errorf("making the pod's network namespace: %w", err)
	}
	list, err := nn.conflist()
	if err != nil {
		return nil, err
	}
	lo, err := libcni.ConfListFromBytes(loopbackConf)
	if err != nil {
		return nil, err
	}
	err = inNetNS(path, func() error { return netSysctls(pod) })
	if err != nil {
		_ = removeNetNS(path)
		return nil, err
	}
	err = nn.net.Do(func() error {
		if _, err := nn.net.cni.AddNetworkList(ctx, lo, sb.runtimeConf("lo")); err != nil {
			return fmt.Errorf("the loopback plugin: %w", err)
		}
		res, err := nn.net.cni.AddNetworkList(ctx, list, sb.runtimeConf("eth0"))
		if err != nil {
			return fmt.Errorf("the bridge plugin: %w", err)
		}
		r, err := types100.NewResultFromResult(res)
		if err != nil {
			return err
		}
		if len(r.IPs) == 0 {
			return errors.New("the bridge plugin gave the pod no address")
		}
		sb.ip = r.IPs[0].Address.IP.String()
		return nil
	})
	if err != nil {
		// What the plugins did of it, and the address, are released as for a removed sandbox.
		_ = nn.detach(ctx, sb)
		return nil, err
	}
	return sb, nil
}

// PodMAC is the MAC the bridge plugin gave the eth0 of the pod with UID podUID, from the result
// libcni cached when the plugin wired the pod, as a runtime keeps it: what the pod network knows
// the pod by.
func (n *Network) PodMAC(podUID string) (net.HardwareAddr, error) {
	// The cache is looked up by the configuration's name alone, the same on every node.
	list, err := nodeNetwork{net: n}.conflist()
	if err != nil {
		return nil, err
	}
	res, err := n.cni.GetNetworkListCachedResult(list, &libcni.RuntimeConf{ContainerID: podUID, IfName: "eth0"})
	if err != nil || res == nil {
		return nil, fmt.Errorf("the pod network's cached result for pod %s: %v", podUID, err)
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, err
	}
	for _, i := range r.Interfaces {
		if i.Name == "eth0" && i.Sandbox != "" {
			return net.ParseMAC(i.Mac)
		}
	}
	return nil, fmt.Errorf("the pod network's result for pod %s names no eth0 in the pod", podUID)
}

// netSysctls sets the pod's network sysctls in the namespace of the calling thread, as a
// runtime sets them in a sandbox's. The others are not the network namespace's; the emulated
// nodes do not isolate what they belong to, so they are left alone.
func netSysctls(pod *corev1.Pod) error {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	for _, sc := range pod.Spec.SecurityContext.Sysctls {
		if !strings.HasPrefix(sc.Name, "net.") {
			continue
		}
		file := filepath.Join("/proc/sys", strings.ReplaceAll(sc.Name, ".", "/"))
		if err := os.WriteFile(file, []byte(sc.Value), 0); err != nil {
			return fmt.Errorf("setting the pod's sysctl %s=%s: %w", sc.Name, sc.Value, err)
		}
	}
	return nil
}

// detach has the plugins release the sandbox's address and removes its namespace.
func (nn nodeNetwork) detach(ctx context.Context, sb *podSandbox) error {
	list, err := nn.conflist()
	if err != nil {
		return err
	}
	err = nn.net.Do(func() error { return nn.net.cni.DelNetworkList(ctx, list, sb.runtimeConf("eth0")) })
	return errors.Join(err, removeNetNS(sb.netns))
}

// newNetNS makes a network namespace and keeps it at path (a bind mount of the namespace).
func newNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	err = podnetwork.OnThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func() error {
		return unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
	})
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("making the network namespace %s: %w", path, err)
	}
	return nil
}

func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// inNetNS runs fn on a thread that joined the namespace at path.
func inNetNS(path string, fn func() error) error {
	ns, err := os.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return podnetwork.OnThread(func() error { return unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET) }, fn)
}
