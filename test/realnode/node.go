package realnode

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// Config describes one real node.
type Config struct {
	// Name is the Node's name.
	Name string
	// Address is the node's InternalIP and the kubelet's listening address; it must be in
	// 127.0.0.0/8, as nothing may be sent anywhere else.
	Address string
	// Kubeconfig holds the kubelet's credentials (an admin kubeconfig will do).
	Kubeconfig string
	// Client is used to play the node's cloud controller (set its address) and to wait for Ready.
	Client kubernetes.Interface
	// Labels are the node's labels, besides those the kubelet sets.
	Labels map[string]string
	// Images are OCI layout archives to import into the node's containerd besides the pause image.
	Images []string
	// Kubelet adjusts the kubelet's configuration before it starts; nil keeps DefaultKubeletConfig.
	Kubelet func(*kubeletv1beta1.KubeletConfiguration)
	// Network is the pod network the node's pods join, as the emulated nodes' pods do (their
	// bridge plugin, with the node's own subnet and bridge in the network's fabric). Without one
	// the node has only a loopback CNI configuration, and only host-network pods can run.
	Network *node.Network
	// OwnCgroupRoot gives the kubelet a cgroupRoot of its own, /lifeboat-node-<Name>, below
	// which its kubepods cgroups are; otherwise they are at the machine's root, as by default.
	// Nodes that run at once on this machine need it, or each kubelet would take the other's
	// pods' cgroups for its own.
	OwnCgroupRoot bool
	// StandardPaths runs the node's containerd and kubelet in a mount namespace of their own in
	// which the node's directories are where a node has them: the kubelet's root directory at
	// /var/lib/kubelet, and /var/run/lifeboat. A DaemonSet's hostPaths (lifeboat's agent's)
	// then find this node's files, unchanged, as on a machine of its own.
	StandardPaths bool
	// RegistryHosts is containerd's registry host configuration (its config_path): one
	// directory per registry host with a hosts.toml; empty leaves containerd's defaults.
	RegistryHosts string
	// KubeletReader is the client certificate the harness reads the kubelet's summary with; nil
	// reads it anonymously, which only a kubelet that lets anonymous callers in answers.
	KubeletReader *tls.Certificate
	// Progress receives start-up messages; nil discards them.
	Progress io.Writer
}

// Node is a running containerd and kubelet registered as a Node.
type Node struct {
	cfg Config
	// Dir holds the node's state: containerd's root and state, the kubelet's root directory,
	// the CNI configuration, pod logs and the components' logs (<component>.log).
	Dir string
	// KubeletConfig is the configuration the kubelet runs with.
	KubeletConfig kubeletv1beta1.KubeletConfiguration

	kubeletBin string
	// runtimeDir holds containerd, its shim and ctr (controlplane.EnsureContainerd).
	runtimeDir string
	socket     string
	containerd *controlplane.Process
	kubelet    *controlplane.Process
	unlock     func()
}

// Standard paths of a node, which StandardPaths binds the node's directories onto.
const (
	standardKubeletRoot = "/var/lib/kubelet"
	standardRunDir      = "/var/run/lifeboat"
)

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// uninitializedTaint is set by a kubelet with an external cloud provider until that provider
// has initialised the node; the harness plays that provider.
const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

// Start runs containerd and the kubelet, imports the images, and waits until the node is
// Ready with its address set. On error nothing is left running.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	kubelet, err := controlplane.EnsureKubelet(ctx, cfg.Progress)
	if err != nil {
		return nil, err
	}
	runtimeDir, err := controlplane.EnsureContainerd(ctx, cfg.Progress)
	if err != nil {
		return nil, err
	}
	// A kubelet owns its kubepods cgroups and reads the machine's memory: real nodes run in one
	// test binary at a time (several at once there, each with its own CgroupRoot).
	unlock, err := lockMachine()
	if err != nil {
		return nil, err
	}
	// Short: containerd's and the kubelet's unix sockets live under it (at most 107 bytes a path).
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		unlock()
		return nil, err
	}
	n := &Node{cfg: cfg, Dir: dir, kubeletBin: kubelet, runtimeDir: runtimeDir, socket: filepath.Join(dir, "containerd.sock"), unlock: unlock}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if err := makeCgroupRoot(n.cgroupParent()); err != nil {
		return nil, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	pause := filepath.Join(dir, "pause.oci.tar")
	if err := PauseGoImage.Build(ctx, root, pause); err != nil {
		return nil, err
	}
	for _, img := range append([]string{pause}, cfg.Images...) {
		if err := n.ImportImage(ctx, img); err != nil {
			return nil, err
		}
	}
	if n.KubeletConfig, err = DefaultKubeletConfig(cfg.Address, n.socket, filepath.Join(dir, "pod-logs")); err != nil {
		return nil, err
	}
	n.KubeletConfig.CgroupRoot = n.cgroupParent()
	if cfg.Kubelet != nil {
		cfg.Kubelet(&n.KubeletConfig)
	}
	if err := n.startKubelet(); err != nil {
		return nil, err
	}
	if err := n.initialise(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "real node %s Ready at %s (cgroup %s, kubelet cgroup driver %s; state in %s)\n",
		cfg.Name, cfg.Address, CgroupHierarchy(), n.KubeletConfig.CgroupDriver, dir)
	return n, nil
}

// CgroupHierarchy is the machine's cgroup hierarchy, "v2" (unified) or "v1", which the kubelet
// and lifeboat's agent (agent/pressure) read their memory figures from.
func CgroupHierarchy() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "v2"
	}
	return "v1"
}

func (c Config) validate() error {
	var errs []error
	if addr, err := netip.ParseAddr(c.Address); err != nil || !netip.MustParsePrefix("127.0.0.0/8").Contains(addr) || !addr.Is4() {
		errs = append(errs, fmt.Errorf("address %q is not an IPv4 address in 127.0.0.0/8", c.Address))
	}
	if c.Name == "" || c.Kubeconfig == "" || c.Client == nil {
		errs = append(errs, errors.New("a real node needs a name, a kubeconfig and a client"))
	}
	for _, bin := range []string{"runc", filepath.Join(cniBinDir, "loopback")} {
		if _, err := exec.LookPath(bin); err != nil {
			errs = append(errs, fmt.Errorf("%s is missing (Debian: apt-get install runc containernetworking-plugins): %w", bin, err))
		}
	}
	return errors.Join(errs...)
}

// Name is the Node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Address is the node's InternalIP.
func (n *Node) Address() string { return n.cfg.Address }

// Network is the pod network the node's pods are on; nil if it has none.
func (n *Node) Network() *node.Network { return n.cfg.Network }

// rootDir is the kubelet's --root-dir, under the node's directory.
const rootDir = "kubelet"

// PodsDir is the kubelet's pods directory (what /var/lib/kubelet/pods is on a node), where
// each pod's volumes are: the agent's --kubelet-pods-dir.
func (n *Node) PodsDir() string { return filepath.Join(n.Dir, rootDir, "pods") }

// cgroupParent is the kubelet's cgroupRoot: "" (the machine's root) or the node's own.
func (n *Node) cgroupParent() string {
	if !n.cfg.OwnCgroupRoot {
		return ""
	}
	return "/" + cgroupPrefix + n.cfg.Name
}

// RunDir is what /var/run/lifeboat is on the node with StandardPaths.
func (n *Node) RunDir() string { return filepath.Join(n.Dir, "run-lifeboat") }

// inOwnMountNamespace is the command that runs bin with args in a new private mount namespace
// where the node's directories are bound onto the standard paths. Private: the kubelet's volume
// mounts stay in it, where containerd's containers (started from it) see them.
func (n *Node) inOwnMountNamespace(bin string, args []string) (string, []string, error) {
	for _, d := range []string{filepath.Join(n.Dir, rootDir), n.RunDir(), standardKubeletRoot, standardRunDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", nil, err
		}
	}
	script := `mount --bind "$1" ` + standardKubeletRoot + ` && mount --bind "$2" ` + standardRunDir + ` && shift 2 && exec "$@"`
	return "unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh",
		filepath.Join(n.Dir, rootDir), n.RunDir(), bin}, args...), nil
}

// kubeletCommand is how the kubelet is started: in containerd's mount namespace with StandardPaths.
func (n *Node) kubeletCommand(args []string) (string, []string) {
	if !n.cfg.StandardPaths {
		return n.kubeletBin, append([]string{"--root-dir", filepath.Join(n.Dir, rootDir)}, args...)
	}
	return "nsenter", append([]string{"--mount=/proc/" + strconv.Itoa(n.containerd.Pid()) + "/ns/mnt", "--", n.kubeletBin, "--root-dir", standardKubeletRoot}, args...)
}

func (n *Node) startContainerd(ctx context.Context) error {
	cniDir := filepath.Join(n.Dir, "cni")
	if err := os.MkdirAll(cniDir, 0o755); err != nil {
		return err
	}
	// The plugins are looked for here first: the pod network's bridge plugin in its fabric.
	cniBin := filepath.Join(n.Dir, "cni-bin")
	if err := os.MkdirAll(cniBin, 0o755); err != nil {
		return err
	}
	if n.cfg.Network != nil {
		subnet, err := n.cfg.Network.RuntimeCNI(cniDir, cniBin)
		if err != nil {
			return fmt.Errorf("the node's share of the pod network: %w", err)
		}
		fmt.Fprintf(n.cfg.Progress, "real node %s: pods on %s\n", n.cfg.Name, subnet)
	} else {
		// The CRI plugin reports the network ready once a CNI configuration loads. Pods then
		// use the host's network, so this loopback-only one is never asked for an address,
		// and nothing outside 127.0.0.0/8 is ever created.
		conflist := `{"cniVersion": "1.0.0", "name": "lifeboat-loopback", "plugins": [{"type": "loopback"}]}`
		if err := os.WriteFile(filepath.Join(cniDir, "10-loopback.conflist"), []byte(conflist), 0o644); err != nil {
			return err
		}
	}
	// restrict_oom_score_adj: this machine withholds CAP_SYS_RESOURCE even from root, so runc
	// cannot give a container a lower oom_score_adj than containerd's own (the sandbox's -998
	// fails with "can't get final child's PID from pipe"); containerd raises such requests to its own.
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %[5]q
[plugins."io.containerd.cri.v1.images".registry]
  config_path = %[9]q
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  # Devices from device plugins owned by the container's user, as docs/security.md asks of nodes
  # whose launchers (never root) get a root-only device such as /dev/userfaultfd.
  device_ownership_from_security_context = true
  # The pods' network namespaces in the node's directory, which Stop and a later start sweep.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[8]q, %[6]q]
    conf_dir = %[7]q
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      SystemdCgroup = false
`, filepath.Join(n.Dir, "containerd", "root"), filepath.Join(n.Dir, "containerd", "state"), n.socket,
		filepath.Join(n.Dir, "containerd", "opt"), PauseImage, cniBinDir, cniDir, cniBin, n.cfg.RegistryHosts)
	path := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return err
	}
	var err error
	// The shim of the same build first: containerd looks for it on PATH before beside itself.
	env := []string{"PATH=" + n.runtimeDir + string(os.PathListSeparator) + os.Getenv("PATH")}
	bin, args := filepath.Join(n.runtimeDir, "containerd"), []string{"--config", path}
	if n.cfg.StandardPaths {
		bin, args, err = n.inOwnMountNamespace(bin, args)
		if err != nil {
			return err
		}
	}
	if n.containerd, err = controlplane.StartProcessWithEnv(n.Dir, "containerd", env, bin, args...); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if n.containerd.Exited() {
			return false, n.containerd.ExitError()
		}
		_, err := n.Ctr(ctx, "version")
		return err == nil, nil
	})
}

// Ctr runs containerd's ctr against the node's containerd, in the kubelet's namespace.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.runtimeDir, "ctr"), append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportImage imports an OCI layout archive into the node's containerd, where the kubelet finds
// it (pods using it need imagePullPolicy Never or IfNotPresent: there is no registry).
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	_, err := n.Ctr(ctx, "images", "import", archive)
	return err
}

// DefaultKubeletConfig is the real node's kubelet configuration: the cgroupfs driver, which the
// kubelet and runc support on cgroup v1 and v2 alike (failCgroupV1 off, for v1 machines), the CRI socket of the node's containerd, loopback only, and eviction settings
// that match manifests/examples but with short periods a test can wait for. A test crosses
// the soft threshold with RestartKubelet.
func DefaultKubeletConfig(address, containerdSocket, podLogsDir string) (kubeletv1beta1.KubeletConfiguration, error) {
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return kubeletv1beta1.KubeletConfiguration{}, err
	}
	f, t := false, true
	endpoint := "unix://" + containerdSocket
	return kubeletv1beta1.KubeletConfiguration{
		TypeMeta:                 metav1.TypeMeta{Kind: "KubeletConfiguration", APIVersion: kubeletv1beta1.SchemeGroupVersion.String()},
		Address:                  address,
		Port:                     int32(ports[0]),
		ReadOnlyPort:             0,
		HealthzPort:              new(int32),
		ContainerRuntimeEndpoint: endpoint,
		ImageServiceEndpoint:     endpoint,
		CgroupDriver:             "cgroupfs",
		FailCgroupV1:             &f,
		FailSwapOn:               &f,
		PodLogsDir:               podLogsDir,
		// The kubelet lets the API server (logs, stats) in without checking its client certificate here.
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: &t},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: &f},
		},
		Authorization:             kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow},
		EvictionSoft:              map[string]string{"memory.available": "1Gi"},
		EvictionSoftGracePeriod:   map[string]string{"memory.available": "5s"},
		EvictionMaxPodGracePeriod: 60,
		// Only memory: the default disk thresholds would evict on a machine whose disk others fill.
		EvictionHard:                     map[string]string{"memory.available": "100Mi"},
		EvictionPressureTransitionPeriod: metav1.Duration{Duration: 5 * time.Second},
	}, nil
}

func (n *Node) writeKubeletConfig() (string, error) {
	b, err := yaml.Marshal(n.KubeletConfig)
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.Dir, "kubelet.yaml")
	return path, os.WriteFile(path, b, 0o644)
}

func (n *Node) startKubelet() error {
	config, err := n.writeKubeletConfig()
	if err != nil {
		return err
	}
	var labels []string
	for k, v := range n.cfg.Labels {
		labels = append(labels, k+"="+v)
	}
	bin, args := n.kubeletCommand([]string{
		"--config", config,
		"--kubeconfig", n.cfg.Kubeconfig,
		"--hostname-override", n.cfg.Name,
		// The kubelet refuses a loopback --node-ip; with an external cloud provider it leaves the
		// node's addresses to that provider, which initialise plays.
		"--cloud-provider", "external",
		"--node-labels", strings.Join(labels, ","),
		"--v", "2",
	})
	n.kubelet, err = controlplane.StartProcess(n.Dir, "kubelet", bin, args...)
	return err
}

// initialise does what a cloud controller does for a new node: sets its address and removes
// the uninitialized taint. Then it waits for the node to be Ready.
func (n *Node) initialise(ctx context.Context) error {
	nodes := n.cfg.Client.CoreV1().Nodes()
	var node *corev1.Node
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if n.kubelet.Exited() {
			return false, n.kubelet.ExitError()
		}
		var err error
		node, err = nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the kubelet to register node %s: %w\n%s", n.cfg.Name, err, n.kubelet.LogTail())
	}
	status, err := json.Marshal(map[string]any{"status": map[string]any{"addresses": []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.cfg.Address}, {Type: corev1.NodeHostName, Address: n.cfg.Name},
	}}})
	if err != nil {
		return err
	}
	if _, err := nodes.PatchStatus(ctx, n.cfg.Name, status); err != nil {
		return fmt.Errorf("setting node %s's address: %w", n.cfg.Name, err)
	}
	if err := n.removeTaint(ctx, node.Name); err != nil {
		return err
	}
	return n.WaitReady(ctx)
}

func (n *Node) removeTaint(ctx context.Context, name string) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		node, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, t := range node.Spec.Taints {
			if t.Key != uninitializedTaint {
				taints = append(taints, t)
			}
		}
		node.Spec.Taints = taints
		_, err = n.cfg.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
}

// WaitReady waits until the node reports Ready.
func (n *Node) WaitReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if n.kubelet.Exited() {
			return false, n.kubelet.ExitError()
		}
		node, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready (last: %s): %w\n%s", n.cfg.Name, last, err, n.kubelet.LogTail())
	}
	return nil
}

// RestartKubelet stops the kubelet, changes its configuration and starts it again; the pods
// keep running meanwhile, as they do when an operator restarts a kubelet.
func (n *Node) RestartKubelet(ctx context.Context, change func(*kubeletv1beta1.KubeletConfiguration)) error {
	n.kubelet.Stop(30 * time.Second)
	change(&n.KubeletConfig)
	if err := n.startKubelet(); err != nil {
		return err
	}
	return n.WaitReady(ctx)
}

// CrossMemorySoftThreshold puts the node under memory pressure as its kubelet sees it: it reads
// memory.available (waiting up to a minute for the kubelet's first figures) and restarts the
// kubelet with an evictionSoft memory.available threshold margin bytes above it, adjusted
// further by change. Other work on the machine moves memory.available by far less than a
// margin of gigabytes, so the threshold stays crossed. It returns the two figures.
func (n *Node) CrossMemorySoftThreshold(ctx context.Context, margin int64, change func(*kubeletv1beta1.KubeletConfiguration)) (available, threshold *resource.Quantity, err error) {
	var avail int64
	var last error
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if avail, err = n.MemoryAvailable(ctx); err != nil && ctx.Err() == nil {
			last = err
		}
		return err == nil, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("no memory.available from the kubelet within a minute: %w", errors.Join(err, last))
	}
	available = resource.NewQuantity(avail, resource.BinarySI)
	threshold = resource.NewQuantity(avail+margin, resource.BinarySI)
	err = n.RestartKubelet(ctx, func(c *kubeletv1beta1.KubeletConfiguration) {
		c.EvictionSoft = map[string]string{"memory.available": threshold.String()}
		change(c)
	})
	return available, threshold, err
}

// MemoryAvailable is the node's memory.available eviction signal as the kubelet computes it,
// read from the kubelet's summary API. It is read directly: the API server's node proxy
// refuses loopback addresses.
func (n *Node) MemoryAvailable(ctx context.Context) (int64, error) {
	available, _, err := n.MemoryAvailableAt(ctx)
	return available, err
}

// MemoryAvailableAt is MemoryAvailable with the time the kubelet's statistics were taken: the
// kubelet serves figures cAdvisor gathered up to its housekeeping interval ago.
func (n *Node) MemoryAvailableAt(ctx context.Context) (int64, time.Time, error) {
	url := fmt.Sprintf("https://%s/stats/summary", net.JoinHostPort(n.cfg.Address, strconv.Itoa(int(n.KubeletConfig.Port))))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, time.Time{}, err
	}
	// The kubelet serves with a certificate it signed itself.
	tlsConfig := &tls.Config{InsecureSkipVerify: true}
	if n.cfg.KubeletReader != nil {
		tlsConfig.Certificates = []tls.Certificate{*n.cfg.KubeletReader}
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("reading node %s's summary: %w", n.cfg.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, time.Time{}, fmt.Errorf("reading node %s's summary: %s", n.cfg.Name, resp.Status)
	}
	var summary struct {
		Node struct {
			Memory struct {
				Time           time.Time `json:"time"`
				AvailableBytes *int64    `json:"availableBytes"`
			} `json:"memory"`
		} `json:"node"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&summary); err != nil {
		return 0, time.Time{}, err
	}
	if summary.Node.Memory.AvailableBytes == nil {
		return 0, time.Time{}, fmt.Errorf("node %s's summary has no memory.availableBytes yet", n.cfg.Name)
	}
	return *summary.Node.Memory.AvailableBytes, summary.Node.Memory.Time, nil
}

// LogTail is the end of a component's log ("kubelet" or "containerd").
func (n *Node) LogTail(component string) string {
	switch {
	case component == "kubelet" && n.kubelet != nil:
		return n.kubelet.LogTail()
	case component == "containerd" && n.containerd != nil:
		return n.containerd.LogTail()
	}
	return ""
}

// Stop ends the kubelet, every container it started, and containerd; unmounts what they
// mounted and removes the node's directory and its Node object.
func (n *Node) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n.kubelet != nil {
		n.kubelet.Stop(30 * time.Second)
	}
	killPodProcesses(n.cgroupParent())
	if n.containerd != nil && !n.containerd.Exited() {
		n.removeContainers(ctx)
		n.containerd.Stop(30 * time.Second)
	}
	removeNodeDir(n.Dir)
	removePodCgroups(cgroupRoot, n.cgroupParent())
	if n.cfg.Client != nil {
		_ = n.cfg.Client.CoreV1().Nodes().Delete(ctx, n.cfg.Name, metav1.DeleteOptions{})
	}
	n.unlock()
}

// removeContainers deletes every task and container, so that their shims exit and clean up.
func (n *Node) removeContainers(ctx context.Context) {
	out, err := n.Ctr(ctx, "containers", "list", "--quiet")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		_, _ = n.Ctr(ctx, "tasks", "delete", "--force", id)
		_, _ = n.Ctr(ctx, "containers", "delete", id)
	}
}

// ContainerLogs returns the end of every container log the kubelet wrote on the node, by
// <namespace>_<pod>_<uid>/<container>, for a failed test's messages.
func (n *Node) ContainerLogs(lines int) map[string]string {
	logs := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(n.KubeletConfig.PodLogsDir, "*", "*", "*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(l) > lines {
			l = l[len(l)-lines:]
		}
		rel, _ := filepath.Rel(n.KubeletConfig.PodLogsDir, filepath.Dir(f))
		logs[rel] = strings.Join(l, "\n")
	}
	return logs
}
