package node

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// KubeletVersion is the version the node reports, that of the control plane it is tested with.
const KubeletVersion = "v1.37.1"

// KVMLabel marks the nodes lifeboat may run VMs on; every emulated node carries it.
const KVMLabel = "lifeboat.dev/kvm"

// DefaultPrivateHostPaths are the host paths each node keeps to itself: the hostPath volumes
// lifeboat's agent and launchers share, and the kubelet's own directory.
var DefaultPrivateHostPaths = []string{"/var/run/lifeboat", "/run/lifeboat", "/var/lib/kubelet"}

// Config describes one emulated node.
type Config struct {
	// Client reaches the API server; it needs the rights of a kubelet (an admin client will do).
	Client kubernetes.Interface
	// Name is the Node's name and its kubernetes.io/hostname label.
	Name string
	// Address is the node's InternalIP, also every pod's IP. It must be in 127.0.0.0/8:
	// nothing may be sent to any other address.
	Address string
	// Capacity is reported as capacity and allocatable; cpu, memory and pods that are
	// missing default to 4, 8Gi and 110.
	Capacity corev1.ResourceList
	// Labels are added to the Node's; kubernetes.io/hostname and lifeboat.dev/kvm=true are
	// always set.
	Labels map[string]string
	// RootDir holds the node's private host paths, its pods' logs and emptyDir volumes.
	RootDir string
	// PrivateHostPaths are the host path prefixes that map under RootDir; nil means
	// DefaultPrivateHostPaths. Other host paths are the machine's own.
	PrivateHostPaths []string
	// Images is an OCI image layout holding the images the node can pull for image volumes, each
	// named by its index entry's io.containerd.image.name annotation; empty means none. Container
	// images are not pulled: containers run the machine's binaries (Binaries).
	Images string
	// Binaries maps a container's command[0] (e.g. "lifeboat-launcher") to the binary on this
	// machine that runs it.
	Binaries map[string]string
	// EvictionMaxPodGracePeriod is the kubelet's evictionMaxPodGracePeriod in seconds: the
	// longest grace period a soft eviction grants. As in the kubelet, zero grants none (the pod
	// still gets the kubelet's minimum of one second).
	EvictionMaxPodGracePeriod int64
	// PodCPUShares, when not zero, puts the node's containers, and all they start, in a cpu
	// cgroup of their own with these shares (a process of its own has 1024), as a kubelet puts
	// pods in its kubepods cgroup; zero leaves them in the node's. A real cluster's control
	// plane has machines of its own; emulated nodes share the test machine's cores with the
	// API server and etcd, which dozens of guests under TCG starve until requests time out.
	// Nice values cannot do it: each QEMU is a session of its own, and so gets a scheduler
	// autogroup, with an equal share, of its own. It needs CPUGroupsAvailable.
	PodCPUShares uint64
	// MemoryPressure is what EvictPod reports it observed.
	MemoryPressure MemoryPressure
	// Devices are the extended resources the node's device plugins would serve, each with the
	// device node it gives a container that asks for it (devices.lifeboat.dev/tun:
	// /dev/net/tun, say). Each is added to the capacity, 110 of it, and a container whose limits
	// name one gets the device, made for its user as containerd's
	// device_ownership_from_security_context does.
	Devices map[corev1.ResourceName]string
	// Network, if set, gives every pod not on the host's network its own network namespace on
	// this pod network, with an address from the node's pod subnet (its spec.podCIDR). Unset,
	// every pod shares the machine's network and has the node's address.
	Network *Network
	// KubeletPort is the port of the node's kubelet API on Address (containerLogs and exec, for
	// kubectl logs and exec through the API server), which the Node's status publishes; 0 picks
	// a free one.
	KubeletPort int
	// Logger receives the node's logs; the zero value means klog's global logger.
	Logger klog.Logger
}

// MemoryPressure is the observation behind an eviction, as the kubelet's eviction manager
// reports it in the pod's status message.
type MemoryPressure struct {
	// Threshold is the memory.available eviction threshold that was crossed; zero means 500Mi.
	Threshold resource.Quantity
	// Available is the memory.available that was observed; zero means 400Mi.
	Available resource.Quantity
	// Hard makes the threshold an evictionHard one: the pod gets no grace period beyond the
	// kubelet's minimum of one second.
	Hard bool
	// Usage is the working set of containers by name. A container missing here is measured:
	// the resident memory of its processes.
	Usage map[string]resource.Quantity
}

var defaultCapacity = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("4"),
	corev1.ResourceMemory: resource.MustParse("8Gi"),
	corev1.ResourcePods:   resource.MustParse("110"),
}

// withDefaults returns a copy of c with the documented defaults filled in and paths made absolute.
func (c Config) withDefaults() (Config, error) {
	capacity := maps.Clone(defaultCapacity)
	for name := range c.Devices {
		capacity[name] = resource.MustParse("110")
	}
	maps.Copy(capacity, c.Capacity)
	c.Capacity = capacity

	labels := maps.Clone(c.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[corev1.LabelHostname] = c.Name
	labels[corev1.LabelOSStable] = "linux"
	labels[corev1.LabelArchStable] = goarch
	labels[KVMLabel] = "true"
	c.Labels = labels

	if c.PrivateHostPaths == nil {
		c.PrivateHostPaths = DefaultPrivateHostPaths
	}
	if c.MemoryPressure.Threshold.IsZero() {
		c.MemoryPressure.Threshold = resource.MustParse("500Mi")
	}
	if c.MemoryPressure.Available.IsZero() {
		c.MemoryPressure.Available = resource.MustParse("400Mi")
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	c.Logger = c.Logger.WithValues("node", c.Name)
	if c.RootDir != "" {
		root, err := filepath.Abs(c.RootDir)
		if err != nil {
			return c, fmt.Errorf("making the root directory %q absolute: %w", c.RootDir, err)
		}
		c.RootDir = root
	}
	return c, nil
}

// validate reports every problem with a defaulted configuration at once.
func (c Config) validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("no Kubernetes client"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(c.Name) {
		errs = append(errs, fmt.Errorf("node name %q: %s", c.Name, msg))
	}
	if addr, err := netip.ParseAddr(c.Address); err != nil || !loopback.Contains(addr) {
		errs = append(errs, fmt.Errorf("address %q is not an IPv4 address in %s", c.Address, loopback))
	}
	if c.RootDir == "" {
		errs = append(errs, errors.New("no root directory"))
	}
	for name, path := range c.Binaries {
		if err := checkExecutable(path); err != nil {
			errs = append(errs, fmt.Errorf("binary for %q: %w", name, err))
		}
	}
	if c.KubeletPort < 0 || c.KubeletPort > 65535 {
		errs = append(errs, fmt.Errorf("kubelet port %d is not a port", c.KubeletPort))
	}
	if c.EvictionMaxPodGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("negative EvictionMaxPodGracePeriod %d", c.EvictionMaxPodGracePeriod))
	}
	return errors.Join(errs...)
}

var loopback = netip.MustParsePrefix("127.0.0.0/8")

func checkExecutable(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
