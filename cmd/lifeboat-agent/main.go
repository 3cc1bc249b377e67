// Command lifeboat-agent is lifeboat's node agent (the virt-handler analogue): one per KVM node.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/deviceplugin"
	"github.com/lifeboat-vm/lifeboat/agent/libvirtclient"
	"github.com/lifeboat-vm/lifeboat/agent/nodecert"
	"github.com/lifeboat-vm/lifeboat/agent/notifyserver"
	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	migrationinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/identity"
	"github.com/lifeboat-vm/lifeboat/api/kube"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/cmd/internal/serve"
)

type options struct {
	kubeconfig, nodeName, nodeAddress, runDir, listen, kubeletConfig string
	healthListen                                                     string
	devicePluginDir, kubeletPodsDir, certDir, namespace              string
	procRoot, cgroupRoot                                             string
	// policyUser is the username the admission policies hold the agent to (identity.Check).
	policyUser                        string
	workers, deviceSlots, kubeletPort int
	maxPodGracePeriod                 int64
	podDirResync, apiLostAfter        time.Duration
}

func main() {
	// The agent's libvirt clients are this binary, re-executed (libvirtclient).
	libvirtclient.MaybeRunChild()
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	flag.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&o.nodeAddress, "node-address", os.Getenv("NODE_IP"), "this node's address, where migration proxies listen for other nodes (default $NODE_IP)")
	flag.StringVar(&o.runDir, "run-dir", "/var/run/lifeboat", "the agent's directory: domains/<vmi-uid> links each VMI to its launcher pod's run volume")
	flag.StringVar(&o.kubeletPodsDir, "kubelet-pods-dir", "/var/lib/kubelet/pods", "the kubelet's pods directory as the agent sees it, where launcher pods' volumes are")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:8185", "address of /metrics and /healthz; loopback by default, as the metrics tell what every VM on the node does")
	flag.StringVar(&o.healthListen, "healthz-listen", "", "another address serving /healthz only, for the kubelet's probe (e.g. \":8186\"); empty: none")
	flag.IntVar(&o.workers, "workers", 4, "reconcile workers")
	flag.IntVar(&o.kubeletPort, "kubelet-port", 10250, "the kubelet's port (its configuration's port), where the agent reads the kubelet's live configuration (/configz) at --node-address; 0: do not")
	flag.StringVar(&o.kubeletConfig, "kubelet-config", "",
		"the node kubelet's KubeletConfiguration file, read for its eviction settings where the kubelet's live configuration (/configz) cannot be read")
	flag.Int64Var(&o.maxPodGracePeriod, "eviction-max-pod-grace-period", -1,
		"the node kubelet's evictionMaxPodGracePeriod in seconds, where neither /configz nor --kubelet-config can be read; -1: the kubelet's default, 0")
	flag.DurationVar(&o.podDirResync, "launcher-dir-resync", 10*time.Second, "how often every launcher directory link is checked against the pods")
	flag.StringVar(&o.devicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins",
		"the kubelet's device plugin directory, where the agent serves devices.lifeboat.dev/* to launcher pods; empty turns the device plugins off")
	flag.IntVar(&o.deviceSlots, "device-slots", 110, "how many pods on the node may hold each device (the kubelet's default maxPods)")
	flag.StringVar(&o.certDir, "cert-dir", "/var/lib/lifeboat/pki", "where the node's migration certificate and key are kept (requested from lifeboat's signer and renewed before they expire)")
	flag.StringVar(&o.namespace, "namespace", "lifeboat-system", "lifeboat's namespace, whose ConfigMap "+migrationtls.CAConfigMap+" holds the migration CA")
	flag.StringVar(&o.procRoot, "proc-root", "/proc", "the node's /proc, read for the node's memory capacity (MemTotal) and swap (SwapTotal)")
	flag.StringVar(&o.policyUser, "policy-user", identity.Agent,
		"the user lifeboat's admission policies (manifests/) hold the agent to; running as another service account, which they would not hold, it refuses to start. Empty: no check")
	flag.StringVar(&o.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "the node's root cgroup file system, read for memory.available as the kubelet computes it")
	flag.DurationVar(&o.apiLostAfter, "api-server-lost-after", time.Minute,
		"how long without reaching the API server (or without running: a frozen node) counts as cut off; the agent pauses and kills nothing meanwhile, and once back reports the outage (Event on its Node) and destroys guests whose VM was restarted elsewhere; 0: do not probe")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("node", o.nodeName)
	if err := run(o, log); err != nil {
		log.Error("lifeboat-agent failed", "err", err)
		os.Exit(1)
	}
}

func run(o options, log *slog.Logger) error {
	if o.nodeName == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	if o.podDirResync <= 0 {
		return fmt.Errorf("--launcher-dir-resync=%s: must be positive", o.podDirResync)
	}
	if o.deviceSlots <= 0 {
		return fmt.Errorf("--device-slots=%d: must be positive", o.deviceSlots)
	}
	kubeClient, lb, err := kube.Clients(o.kubeconfig)
	if err != nil {
		return err
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := identity.Check(ctx, kubeClient, o.policyUser); err != nil {
		return err
	}
	settings, source, err := kubeletSettings(ctx, o, restConfig, log)
	if err != nil {
		return err
	}
	if source == agent.KubeletSourceDefaults {
		log.Warn("the kubelet's eviction settings could not be read: its upstream defaults are assumed (no evictionSoft, evictionHard memory.available<100Mi, evictionMaxPodGracePeriod as --eviction-max-pod-grace-period says, else 0)",
			"evictionMaxPodGracePeriod", settings.MaxPodGracePeriod)
	} else {
		log.Info("the kubelet's eviction settings", "source", source, "evictionMaxPodGracePeriod", settings.MaxPodGracePeriod,
			"softMemoryAvailable", settings.Soft, "hardMemoryAvailable", settings.Hard)
	}
	maxGrace, thresholds := &settings.MaxPodGracePeriod, settings.Thresholds
	recorder, stopRecorder, err := kube.Recorder(ctx, kubeClient, "lifeboat-agent", o.nodeName)
	if err != nil {
		return err
	}
	defer stopRecorder()

	reg := prometheus.NewRegistry()
	reg.MustRegister(kube.RequestsMetric)
	// Migration streams between nodes are TLS with this node's certificate (agent/nodecert).
	certs, err := nodecert.Start(ctx, kubeClient, o.nodeName, o.certDir, o.namespace, reg)
	if err != nil {
		return err
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	readMemory := func() (pressure.Memory, error) { return pressure.ReadMemory(o.procRoot, o.cgroupRoot) }
	pressure.RegisterMetrics(reg, readMemory, thresholds)
	// Each factory's field selector applies to every type in it: the node's VMIs, the
	// migrations leaving it and those reaching it (a field selector cannot say "or"), and the
	// configuration unfiltered.
	bySelector := func(field string) lifeboatinformers.SharedInformerFactory {
		return lifeboatinformers.NewSharedInformerFactoryWithOptions(lb, 0, lifeboatinformers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = field + "=" + o.nodeName
		}))
	}
	informers, outbound, inbound := bySelector("status.nodeName"), bySelector("status.sourceNode"), bySelector("status.targetNode")
	configInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	// This node's launcher pods: a deletion through the API explains a launcher's SIGTERM.
	pods := coreinformers.NewFilteredPodInformer(kubeClient, metav1.NamespaceAll, 0, cache.Indexers{}, func(lo *metav1.ListOptions) {
		lo.FieldSelector = "spec.nodeName=" + o.nodeName
		lo.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	})
	// Launchers run as their own unprivileged user; each reports on the socket in its own pod.
	var a *agent.Agent
	notifyServer := notifyserver.New([]uint32{contract.UID}, func(m *notify.Message, pid int32) { a.HandleNotify(m, pid) }, reg, log)
	a, err = agent.New(agent.Config{
		NodeName:   o.nodeName,
		DomainsDir: filepath.Join(o.runDir, "domains"),
		// libvirt's client runs in a confined child per launcher, never in the agent (libvirtclient).
		Dial:              agent.LibvirtDialer(filepath.Join(o.runDir, "libvirt-relays"), log),
		Configs:           configInformers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(),
		MaxPodGracePeriod: maxGrace,
		NodeAddress:       o.nodeAddress,
		Certificates:      certs,
		Recorder:          recorder,
		Metrics:           agent.NewMetrics(reg),
		Log:               log,
		LauncherExit:      launcherExit(kubeClient, o.nodeName),
		GetPod:            getPod(kubeClient),
		EndpointSlices:    endpointSlices(kubeClient),
		PodInformer:       pods,
		KubeletPodsDir:    o.kubeletPodsDir,
		PodDirResync:      o.podDirResync,
		ServeNotify:       notifyServer.Serve,
		TellLauncher:      notifyServer.Tell,
		Memory:            readMemory,
		NodeSwap:          func() (uint64, error) { return pressure.SwapTotal(o.procRoot) },
		Thresholds:        thresholds,
		PodWorkingSet:     func(uid string) (uint64, bool) { return pressure.PodWorkingSet(o.cgroupRoot, uid) },
		LabelNode:         labelNode(kubeClient, o.nodeName),
		KubeletSource:     source,
		PublishExposure:   annotateNode(kubeClient, o.nodeName),
		APILostAfter:      o.apiLostAfter,
	}, lb, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), configInformers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]migrationinformers.VirtualMachineInstanceMigrationInformer{outbound.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations(), inbound.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		return err
	}
	notifyServer.HandleNetwork(a.SetupNetwork)
	// The node's QEMU probe, whose file the agent gives each new launcher (agent.QEMUCapabilities).
	probes := coreinformers.NewFilteredPodInformer(kubeClient, o.namespace, 0, cache.Indexers{}, func(lo *metav1.ListOptions) {
		lo.FieldSelector = "spec.nodeName=" + o.nodeName
		lo.LabelSelector = "app.kubernetes.io/name=" + contract.QEMUProbeApp
	})
	notifyServer.HandleQEMUCapabilities(agent.QEMUCapabilities(func() []string {
		var pods []*corev1.Pod
		for _, obj := range probes.GetStore().List() {
			pods = append(pods, obj.(*corev1.Pod))
		}
		return agent.QEMUProbeFiles(pods, o.kubeletPodsDir)
	}))
	notifyServer.HandleEnd(a.HandleNotifyEnd)
	if err := os.MkdirAll(filepath.Join(o.runDir, "domains"), 0o755); err != nil {
		return err
	}
	// The relays of an agent before this one are gone with it.
	if err := os.RemoveAll(filepath.Join(o.runDir, "libvirt-relays")); err != nil {
		return err
	}

	// Metrics say what every VM on the node does: loopback unless the admin opens them.
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", serve.Health())
	errc := make(chan error, 4)
	go func() { errc <- serve.HTTP(ctx, o.listen, mux) }()
	if o.healthListen != "" {
		go func() { errc <- serve.HTTP(ctx, o.healthListen, serve.Health()) }()
	}
	for _, f := range []lifeboatinformers.SharedInformerFactory{informers, outbound, inbound, configInformers} {
		f.Start(ctx.Done())
	}
	go pods.RunWithContext(ctx)
	go probes.RunWithContext(ctx)
	go func() { errc <- a.Run(ctx, o.workers) }()
	if o.devicePluginDir != "" {
		runDevicePlugins(ctx, o, reg, log)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	return err
}

// labelNode sets or removes the node's LabelMemoryPressureRelief by a merge patch of that label
// alone (all manifests/agent-node-restriction.yaml lets an agent change).
func labelNode(kube kubernetes.Interface, node string) func(ctx context.Context, relieving bool) error {
	return func(ctx context.Context, relieving bool) error {
		value := any(nil)
		if relieving {
			value = "true"
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{v1alpha1.LabelMemoryPressureRelief: value}}})
		if err != nil {
			return err
		}
		_, err = kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
}

// annotateNode sets the node's AnnotationEvictionExposure by a merge patch of that annotation
// alone (manifests/agent-node-restriction.yaml lets an agent change no other).
func annotateNode(kube kubernetes.Interface, node string) func(ctx context.Context, e v1alpha1.NodeEvictionExposure) error {
	return func(ctx context.Context, e v1alpha1.NodeEvictionExposure) error {
		value, err := json.Marshal(e)
		if err != nil {
			return err
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.AnnotationEvictionExposure: string(value)}}})
		if err != nil {
			return err
		}
		_, err = kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
}

// launcherExit reads, from the kubelet's record of the pod, how the launcher in it ended: only
// the pod with that UID on this node counts.
// getPod reads a pod on any node: a migration's source and target pods, for their addresses.
func getPod(client kubernetes.Interface) func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		// Listed, not read: the agent may list pods but not get them (manifests/agent-rbac.yaml).
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			return nil, err
		}
		if len(pods.Items) != 1 {
			return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
		}
		return &pods.Items[0], nil
	}
}

// endpointSlices lists a namespace's EndpointSlices: whether one still lists a migration's
// source pod.
func endpointSlices(client kubernetes.Interface) func(ctx context.Context, namespace string) ([]discoveryv1.EndpointSlice, error) {
	return func(ctx context.Context, namespace string) ([]discoveryv1.EndpointSlice, error) {
		list, err := client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		return list.Items, nil
	}
}

func launcherExit(client kubernetes.Interface, nodeName string) func(ctx context.Context, namespace, name string, podUID types.UID) (*int32, error) {
	return func(ctx context.Context, namespace, name string, podUID types.UID) (*int32, error) {
		// Listed, not read: the agent may list pods but not get them (manifests/agent-rbac.yaml).
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "metadata.name=" + name + ",spec.nodeName=" + nodeName,
		})
		if err != nil {
			return nil, err
		}
		for _, pod := range pods.Items {
			if pod.UID != podUID {
				continue
			}
			for _, cs := range pod.Status.ContainerStatuses {
				if cs.Name == contract.ContainerName && cs.State.Terminated != nil {
					return &cs.State.Terminated.ExitCode, nil
				}
			}
		}
		return nil, nil
	}
}

// runDevicePlugins serves each device the node has to the kubelet, in the background until ctx
// ends; a device the node lacks is not advertised, so the scheduler keeps pods that need it away.
func runDevicePlugins(ctx context.Context, o options, reg prometheus.Registerer, log *slog.Logger) {
	registrations := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lifeboat_agent_device_plugin_registrations_total",
		Help: "Registrations of the agent's device plugins that the kubelet took up (it fetched the device list), again after each kubelet restart, by resource.",
	}, []string{"resource"})
	reg.MustRegister(registrations)
	for _, d := range deviceplugin.Devices {
		if !deviceplugin.Present(d) {
			log.Info("device not advertised: the node lacks it", "resource", d.Resource(), "path", d.Path)
			continue
		}
		p := &deviceplugin.Plugin{Device: d, Slots: o.deviceSlots, Dir: o.devicePluginDir, Log: log,
			Registered: registrations.WithLabelValues(d.Resource()).Inc}
		go p.Run(ctx)
	}
}
