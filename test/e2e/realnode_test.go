package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
	"github.com/lifeboat-vm/lifeboat/test/realnode"
)

// The real node of these tests. Their migration target is an emulated node (test/node) with its
// agent as a host process: a second kubelet would share this machine's kubepods cgroups and
// its memory.available signal, so both would evict at once.
const (
	realNodeName    = "real-1"
	realNodeAddress = "127.0.0.31"
	// realMaxGrace is the real kubelet's evictionMaxPodGracePeriod, as in manifests/examples. The
	// VMIs ask for 45 s, so their pods' own grace period (45 + 15 s) is the same.
	realMaxGrace = 60
)

// lifeboatImages builds lifeboat's images and the test guest's once for the package, into the
// directory of its binaries.
var lifeboatImages = sync.OnceValues(func() ([]string, error) {
	dir := filepath.Join(bins, "images")
	if err := images.Build(context.Background(), dir, os.Stderr); err != nil {
		return nil, fmt.Errorf("building lifeboat's images: %w", err)
	}
	var archives []string
	for _, c := range images.Components {
		archives = append(archives, filepath.Join(dir, c.Archive()))
	}
	// The test guest's kernel and disk images, which the real node's VMs boot from.
	guestImages, err := images.GuestImages(image)
	if err != nil {
		return nil, err
	}
	for ref, img := range guestImages {
		archive := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".oci.tar")
		if err := images.WriteArchive(archive, img, ref); err != nil {
			return nil, err
		}
		archives = append(archives, archive)
	}
	return archives, nil
})

// startRealNode starts the real node with lifeboat's images imported, labelled for VMs, its
// kubelet configured further by configure. Its pods are on a pod network of their own test
// (realnode.Node.Network), which emulated nodes may join.
func startRealNode(t testing.TB, configure ...func(*kubeletv1beta1.KubeletConfiguration)) *realnode.Node {
	t.Helper()
	return startRealNodeOn(t, node.NewTestNetwork(t), configure...)
}

// startRealNodeOn is startRealNode with its pods on network, which emulated nodes may share.
func startRealNodeOn(t testing.TB, network *node.Network, configure ...func(*kubeletv1beta1.KubeletConfiguration)) *realnode.Node {
	t.Helper()
	archives, err := lifeboatImages()
	if err != nil {
		t.Fatal(err)
	}
	n, err := realnode.Start(t.Context(), realnode.Config{
		Name: realNodeName, Address: realNodeAddress, Kubeconfig: cluster.Kubeconfig, Client: cluster.Kube,
		Labels: map[string]string{node.KVMLabel: "true"}, Images: archives, Progress: os.Stderr,
		Network: network,
		Kubelet: func(c *kubeletv1beta1.KubeletConfiguration) {
			c.EvictionMaxPodGracePeriod = realMaxGrace
			for _, f := range configure {
				f(c)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log:\n%s", tail(n.LogTail("kubelet"), 40))
		}
		n.Stop()
	})
	return n
}

// overlay adapts manifests/ to the real test node, which has neither a registry nor a route
// from its pod network to the API server (the kubernetes Service): images are never pulled,
// lifeboat's own pods use the node's network and reach the API server on loopback, the agent
// reads this kubelet's /configz on its port and listens on a free port of the node's address, one
// controller replica runs (two on one host network would share ports), the signer serves no
// metrics and declares no port (on the host network its port would be the controller's, and the
// scheduler would not place both), the controller and the signer run on the one
// node although it runs VMs (their node affinity keeps them off such nodes in a cluster), and
// launchers are TCG guests. Launcher pods are on the pod network, as in a cluster.
const overlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %[1]s
patches:
- patch: |-
    apiVersion: apps/v1
    kind: DaemonSet
    metadata: {name: lifeboat-agent, namespace: lifeboat-system}
    spec:
      template:
        spec:
          nodeSelector: {kubernetes.io/hostname: %[2]s}
          containers:
          - name: agent
            imagePullPolicy: Never
            env: [{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}, {name: KUBERNETES_SERVICE_PORT, value: "%[3]s"}]
          volumes:
          - {name: kubelet-pods, hostPath: {path: %[7]s}}
- target: {kind: DaemonSet, name: lifeboat-agent}
  patch: |-
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--listen=%[5]s:%[6]d"}
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--healthz-listen="}
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--kubelet-port=%[4]d"}
    - {op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: %[6]d}
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: lifeboat-controller, namespace: lifeboat-system}
    spec:
      replicas: 1
      template:
        spec:
          hostNetwork: true
          nodeSelector: {kubernetes.io/hostname: %[2]s}
          containers:
          - name: controller
            imagePullPolicy: Never
            env: [{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}, {name: KUBERNETES_SERVICE_PORT, value: "%[3]s"}]
- target: {kind: Deployment, name: lifeboat-controller}
  patch: |-
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: --acceleration=tcg}
    - {op: remove, path: /spec/template/spec/affinity/nodeAffinity}
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: lifeboat-signer, namespace: lifeboat-system}
    spec:
      template:
        spec:
          hostNetwork: true
          nodeSelector: {kubernetes.io/hostname: %[2]s}
          containers:
          - name: signer
            imagePullPolicy: Never
            env: [{name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}, {name: KUBERNETES_SERVICE_PORT, value: "%[3]s"}]
- target: {kind: Deployment, name: lifeboat-signer}
  patch: |-
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: --metrics-listen=}
    - {op: remove, path: /spec/template/spec/containers/0/ports}
    - {op: remove, path: /spec/template/spec/affinity/nodeAffinity}
`

// deployLifeboat applies manifests/, through the test overlay, with server-side apply, and waits
// for the agent and the controller to be Ready on the real node. Cleanup removes what it made but
// the CRDs, which the rest of the package uses. It returns the agent's /metrics URL.
func deployLifeboat(t testing.TB, n *realnode.Node) string {
	t.Helper()
	return deployLifeboatParts(t, n, true)
}

// noController is the overlay's patch for a cluster whose controller runs elsewhere (the soak's,
// a process of the test that its faults kill): the Deployment keeps no replica.
const noController = `- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: lifeboat-controller, namespace: lifeboat-system}
    spec:
      replicas: 0
`

// serviceAccountsOnly are manifests/' admission policy bindings that refuse what only lifeboat's
// controller's or agents' ServiceAccounts may do (their labels on pods, launcher pods' devices,
// migrations' evacuation records, VMIs' launcher pod records).
var serviceAccountsOnly = []string{"lifeboat-reserved-metadata", "lifeboat-launcher-devices",
	"lifeboat-evacuation-record", "lifeboat-launcher-pod-record"}

// deployLifeboatParts is deployLifeboat, with the controller's Deployment at no replica unless
// withController.
func deployLifeboatParts(t testing.TB, n *realnode.Node, withController bool) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// kustomize takes a base only by a relative path.
	base, err := filepath.Rel(dir, filepath.Join(root, "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	apiPort := cluster.Host[strings.LastIndex(cluster.Host, ":")+1:]
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(overlay, base, n.Name(), apiPort, n.KubeletConfig.Port, n.Address(), ports[0], n.PodsDir())
	apps := []string{"lifeboat-agent", "lifeboat-controller", "lifeboat-signer", launcher.QEMUProbeApp}
	if !withController {
		kustomization += noController
		apps = slices.DeleteFunc(apps, func(a string) bool { return a == "lifeboat-controller" })
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpContainerLogs(t, n)
		}
		ctx := context.Background()
		// The namespace stays: the migration CA in it is the cluster's, as the controller
		// replicas of other tests use it.
		_, _ = cluster.Kubectl(ctx, "delete", "-n", "lifeboat-system", "deployment,daemonset,service,serviceaccount,role,rolebinding,networkpolicy",
			"-l", "app.kubernetes.io/part-of=lifeboat", "--ignore-not-found", "--wait")
		_, _ = cluster.Kubectl(ctx, "delete", "clusterrole,clusterrolebinding,validatingwebhookconfiguration,validatingadmissionpolicy,validatingadmissionpolicybinding",
			"-l", "app.kubernetes.io/part-of=lifeboat", "--ignore-not-found")
	})
	// The CRDs are already there (the control plane installs them): applying takes them over.
	if out, err := cluster.Kubectl(t.Context(), "apply", "--server-side", "--force-conflicts", "-k", dir); err != nil {
		t.Fatalf("applying manifests/: %v\n%s", err, out)
	}
	if !withController {
		// The configuration calls the Deployment's Service, which has no replica behind it; the
		// controller that runs elsewhere registers its own, with its URL (the API server refuses
		// the two merged, a URL and a Service).
		if err := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(t.Context(), webhook.ConfigurationName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// The policies that let only lifeboat's ServiceAccounts do some things go too: the
		// controller that runs elsewhere, and emulated nodes' agents, are processes of the test
		// acting as the cluster's admin.
		for _, binding := range serviceAccountsOnly {
			if err := cluster.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(t.Context(), binding, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("removing the policy binding %s: %v", binding, err)
			}
		}
	}
	for _, app := range apps {
		waitReadyPod(t, "lifeboat-system", "app.kubernetes.io/name="+app, 3*time.Minute)
	}
	return fmt.Sprintf("http://%s:%d/metrics", n.Address(), ports[0])
}

// dumpContainerLogs shows the end of every container log on the real node, for a failed test;
// it must run before the pods are deleted, which deletes their logs.
func dumpContainerLogs(t testing.TB, n *realnode.Node) {
	logs := n.ContainerLogs(40)
	names := make([]string, 0, len(logs))
	for name := range logs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Logf("container log %s:\n%s", name, logs[name])
	}
}

// waitReadyPod waits until a pod with the label selector runs Ready on the real node.
func waitReadyPod(t testing.TB, ns, selector string, timeout time.Duration) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(pods.Items) == 0 {
			last = "no pod" + whyNoPod(ctx, ns, selector)
			return false, nil
		}
		p := pods.Items[0]
		last = fmt.Sprintf("%s on %q: phase %s, containers %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return p.Spec.NodeName == realNodeName, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("want a Ready pod %s in %s on %s within %s; last seen %s", selector, ns, realNodeName, timeout, last)
	}
}

// whyNoPod is what the ReplicaSets of selector say of the pods they could not create, if anything.
func whyNoPod(ctx context.Context, ns, selector string) string {
	sets, err := cluster.Kube.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return ""
	}
	var why []string
	for _, rs := range sets.Items {
		for _, c := range rs.Status.Conditions {
			if c.Type == appsv1.ReplicaSetReplicaFailure {
				why = append(why, rs.Name+": "+c.Message)
			}
		}
	}
	if len(why) == 0 {
		return fmt.Sprintf(" (%d ReplicaSet(s), none failing)", len(sets.Items))
	}
	return " (" + strings.Join(why, "; ") + ")"
}

// realConsolePath is where the launcher of pod writes the guest's console on the real node: in
// the pod's run volume, in the real kubelet's pod directory.
func realConsolePath(n *realnode.Node, pod *corev1.Pod) string {
	return filepath.Join(n.PodsDir(), string(pod.UID), "volumes/kubernetes.io~empty-dir", launcher.RunVolume, launcher.ConsoleLog)
}

// realVM starts lifeboat on the real node, a LiveMigrate VM there, and an emulated node to
// migrate to; it returns when the guest counts.
func realVM(t *testing.T, gateOn bool) (*realnode.Node, *testNode, *v1alpha1.VirtualMachineInstance, int) {
	t.Helper()
	real := startRealNode(t)
	deployLifeboat(t, real)
	setConfig(t, gateOn)
	vmi, before := realNodeVM(t, real, testNamespace(t), "real")
	// The target joins only now, so that the VM could start nowhere else.
	target := startNodes(t, 1, node.OnNetwork(real.Network()))[0]
	return real, target, vmi, before
}

// realNodeVM starts a LiveMigrate VM on the real node, which must be the only node that can take
// it, and returns it once its guest counts, with the counter, and answers on its pod's address.
// The VM's labels are app=name.
func realNodeVM(t testing.TB, real *realnode.Node, ns, name string) (*v1alpha1.VirtualMachineInstance, int) {
	t.Helper()
	// As a user writes it: the kernel from an image and a containerDisk, both image volumes that
	// the node's containerd mounts (the guest keeps its journal on the disk's overlay), and a
	// card on the pod network, which the node's containerd wires through CNI.
	vmi := createVMI(t, ns, newVMI(name, strategy(v1alpha1.EvictionStrategyLiveMigrate), withContainerDisk, withPodNetwork, func(v *v1alpha1.VirtualMachineInstance) {
		v.Labels = map[string]string{"app": name}
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](realMaxGrace - 15)
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	if vmi.Status.NodeName != real.Name() {
		t.Fatalf("the VM must start on the real node, the only one that can take it: %s", describe(vmi))
	}
	pod := launcherPod(t, vmi)
	checkUnprivileged(t, pod, true)
	if pod.Spec.HostNetwork || pod.Status.PodIP == "" || pod.Status.PodIP == real.Address() {
		t.Fatalf("the launcher pod must have an address of its own on the pod network, not the node's %s: hostNetwork %t, address %q",
			real.Address(), pod.Spec.HostNetwork, pod.Status.PodIP)
	}
	counter := waitCounterPast(t, realConsolePath(real, pod), 0, bootTimeout)
	boot, _ := waitGuestAnswer(t, real.Network(), net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(protocol.ServePort)), bootTimeout)
	t.Logf("the guest (boot %s) answers on its launcher pod's address %s", boot, pod.Status.PodIP)
	return vmi, counter
}

// crossSoftThreshold makes the real node's memory.available fall below its kubelet's evictionSoft
// threshold for longer than its evictionSoftGracePeriod (5 s).
func crossSoftThreshold(t *testing.T, n *realnode.Node) {
	t.Helper()
	available, threshold, err := n.CrossMemorySoftThreshold(t.Context(), 2<<30, func(c *kubeletv1beta1.KubeletConfiguration) {
		c.EvictionSoftGracePeriod = map[string]string{"memory.available": "5s"}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memory.available %s: evictionSoft memory.available<%s for 5s", available, threshold)
}

// kubeletEviction waits for the real kubelet's Evicted event on the pod: when the eviction
// manager picked it and sent SIGTERM.
func kubeletEviction(t *testing.T, pod *corev1.Pod, timeout time.Duration) time.Time {
	t.Helper()
	e := kubewait.Event(t, cluster.Kube, pod.Namespace, fields.Set{"involvedObject.name": pod.Name, "reason": "Evicted", "source": "kubelet"}, timeout)
	t.Logf("the kubelet evicted %s: %s", pod.Name, e.Message)
	if e.FirstTimestamp.IsZero() {
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// sourceExitedCleanly checks that the launcher container exited 0 before the grace period
// ended (so it was never SIGKILLed), and that the kubelet recorded why it ended the pod. get
// reads the pod as last seen.
func sourceExitedCleanly(t *testing.T, pod *corev1.Pod, evicted time.Time, get func(context.Context) (*corev1.Pod, error)) {
	t.Helper()
	last := kubewait.For(t, (realMaxGrace+30)*time.Second, "the source pod "+pod.Name+" ended", get, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	},
		func(p *corev1.Pod) string { return fmt.Sprintf("%+v", p.Status) })
	cs := last.Status.ContainerStatuses
	if len(cs) == 1 && statusLost(cs[0]) {
		// kubelet v1.37.1 removes an evicted pod's dead containers as soon as it syncs the pod
		// (kubelet.go: "status read is async and during eviction we already expect to not have
		// some container info"); when that wins the race with the status it writes, the exit code
		// is gone and it reports a made-up 137. The kubelet SIGKILLs only at the end of the grace
		// period, so a container that stopped being ready well before then exited by itself.
		ready := podCondition(last, corev1.ContainersReady)
		if ready == nil || ready.Status != corev1.ConditionFalse {
			t.Fatalf("the kubelet lost the source launcher's exit code, and its pod does not say when it stopped: %+v", last.Status)
		}
		if kill := evicted.Add(realMaxGrace * time.Second); !ready.LastTransitionTime.Add(5 * time.Second).Before(kill) {
			t.Fatalf("the source launcher stopped at %s, too close to the kubelet's SIGKILL at %s to have exited by itself", ready.LastTransitionTime, kill)
		}
		t.Logf("the kubelet lost the source launcher's exit code (it removed the evicted pod's container first); the container stopped %s after the eviction, %s before the SIGKILL would have come",
			ready.LastTransitionTime.Sub(evicted).Round(time.Second), evicted.Add(realMaxGrace*time.Second).Sub(ready.LastTransitionTime.Time).Round(time.Second))
		evictedForMemory(t, last)
		return
	}
	if len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 0 {
		t.Fatalf("the source launcher must exit 0 by itself, never SIGKILLed: %+v", cs)
	}
	end := cs[0].State.Terminated.FinishedAt.Time
	// Event and container times have one-second resolution.
	if limit := evicted.Add(realMaxGrace*time.Second + time.Second); end.After(limit) {
		t.Errorf("the source launcher exited at %s, after the grace period (evicted at %s, %ds)", end, evicted, realMaxGrace)
	}
	t.Logf("the source launcher exited 0 %s after the eviction (grace %ds)", end.Sub(evicted), realMaxGrace)
	// kubelet v1.37.1 takes a terminated pod's phase from its containers: a launcher that exited 0
	// leaves its pod Succeeded, not Failed with reason Evicted (which the kubelet keeps only when
	// a container ended non-zero, as one it SIGKILLed does). The eviction is recorded in the
	// DisruptionTarget condition.
	if last.Status.Phase != corev1.PodSucceeded {
		t.Errorf("the source pod's phase is %s (reason %q), want Succeeded: its launcher exited 0", last.Status.Phase, last.Status.Reason)
	}
	evictedForMemory(t, last)
}

// evictedForMemory checks that the kubelet recorded its eviction for memory on the pod.
func evictedForMemory(t *testing.T, p *corev1.Pod) {
	t.Helper()
	c := podCondition(p, corev1.DisruptionTarget)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != "TerminationByKubelet" || !strings.Contains(c.Message, "memory") {
		t.Errorf("the kubelet records its eviction for memory in the DisruptionTarget condition: %+v", c)
	}
}

// statusLost reports whether the kubelet wrote a container's status without finding the container
// (reason ContainerStatusUnknown, exit code 137 made up): it had removed the container already.
// It writes that as the last state (the pod deleted) or, when it also lost the container as the
// pod was terminated, as the current one too (seen in a clean-clone CI at 147a33f).
func statusLost(cs corev1.ContainerStatus) bool {
	unknown := func(t *corev1.ContainerStateTerminated) bool { return t != nil && t.Reason == "ContainerStatusUnknown" }
	return unknown(cs.LastTerminationState.Terminated) && (cs.State.Terminated == nil || unknown(cs.State.Terminated))
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// TestRealNodePressureLiveMigratesTheVM: lifeboat deployed from manifests/ on a real kubelet; a
// LiveMigrate VM runs in a real pod there; memory pressure makes the kubelet's eviction manager
// pick the VM pod and send SIGTERM; the VM live-migrates to the other node before the grace
// period ends, its guest keeps counting, and the source launcher exits 0 in time.
func TestRealNodePressureLiveMigratesTheVM(t *testing.T) {
	real, target, vmi, before := realVM(t, true)
	sourcePod := launcherPod(t, vmi)
	// A Service selects the VM; kube-proxy routes it for the pod network's clients.
	proxy, err := controlplane.EnsureKubeProxy(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	node.StartTestServiceProxy(t, real.Network(), proxy, cluster.Kubeconfig, real.Name())
	service := createService(t, vmi.Namespace, vmi.Labels["app"])
	// The source pod may be deleted once it has ended (StillReadyWithoutGuest): the watch keeps
	// what it last was.
	switches := watchSwitch(t, vmi.Namespace)
	t.Cleanup(switches.close)
	boot, _ := waitGuestAnswer(t, real.Network(), service, bootTimeout)
	// The launcher started its libvirtd with what the node's QEMU probe (the DaemonSet's pod on
	// the real kubelet) found, from its agent.
	if log, err := cluster.Kube.CoreV1().Pods(vmi.Namespace).GetLogs(sourcePod.Name, &corev1.PodLogOptions{Container: launcher.ContainerName}).DoRaw(t.Context()); err != nil ||
		!strings.Contains(logLine(string(log), "QEMU capabilities loaded"), `"fromAgent":true`) {
		t.Errorf("the launcher on the real node must load the QEMU probe's capabilities from its agent (err %v): %q", err, logLine(string(log), "QEMU capabilities loaded"))
	}
	crossSoftThreshold(t, real)
	evicted := kubeletEviction(t, sourcePod, 2*time.Minute)

	moved := waitVMI(t, vmi.Namespace, vmi.Name, realMaxGrace*time.Second, "the VM on the other node",
		func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
		})
	t.Logf("migrated from %s to %s %s after the eviction (mode %s)", real.Name(), target.Name(),
		time.Since(evicted).Round(time.Second), moved.Status.MigrationState.Mode)
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)
	waitJournal(t, target.consolePath(moved), before, 30*time.Second)
	// The Service follows the VM to its pod on the other node: the same boot answers there.
	if again, counter := waitGuestAnswer(t, real.Network(), service, 30*time.Second); again != boot || counter < before {
		t.Errorf("through the Service after the migration: boot %s counter %d, want boot %s counting on from %d", again, counter, boot, before)
	}
	if s := moved.Status.MigrationState; s.Cause != v1alpha1.MigrationCauseNodePressure || s.SourceNode != real.Name() {
		t.Errorf("migration state %+v: want cause NodePressure from %s", s, real.Name())
	}
	if c := meta.FindStatusCondition(moved.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); moved.Status.EvacuationNodeName != "" || c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("a migrated VM is no longer marked: %s", describe(moved))
	}
	sourceExitedCleanly(t, sourcePod, evicted, func(context.Context) (*corev1.Pod, error) {
		if p := switches.lastPod(sourcePod.Name); p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("the watch has not seen pod %s", sourcePod.Name)
	})
	sourceLeftPromptly(t, real, switches, sourcePod.Name, moved.Status.LauncherPod.Name, vmi.Name)
	if v := waitVMI(t, vmi.Namespace, vmi.Name, 10*time.Second, "Running on the target", running); v.Status.NodeName != target.Name() {
		t.Errorf("the VMI must run on %s: %s", target.Name(), describe(v))
	}
}

// sourceLeavesWithin bounds how long an evicted source pod stays once the target pod is a ready
// endpoint of the VM's Service. Its kubelet keeps it Ready while it ends it, so lifeboat deletes
// it after vmi.KubeletFollowsGateWithin (plus the gate's one-second time resolution); its agent
// then forwards for agent.ForwardAfterEndpoints more, and the launcher and the kubelet take the
// rest. Before lifeboat deleted it, the launcher's own bound ended it: half its grace period
// after the eviction, 28 s after the target was ready in the run that found it.
const sourceLeavesWithin = vmi.KubeletFollowsGateWithin + time.Second + agent.ForwardAfterEndpoints + 5*time.Second

// sourceLeftPromptly checks that the source pod ended within sourceLeavesWithin of the target
// pod's becoming a ready endpoint, and that the source agent's forward ended on the
// EndpointSlices' word, not at its bound.
func sourceLeftPromptly(t *testing.T, real *realnode.Node, switches *switchWatch, sourcePod, targetPod, vmiName string) {
	t.Helper()
	targetReady := switches.firstOf(func(e string) bool {
		ready, ok := strings.CutPrefix(e, "slice ready ")
		return ok && slices.Contains(strings.Split(ready, ","), targetPod)
	})
	ended := switches.firstOf(func(e string) bool {
		return e == podPhase(sourcePod, corev1.PodSucceeded) || e == podPhase(sourcePod, corev1.PodFailed) || e == podDeleted(sourcePod)
	})
	if targetReady.IsZero() || ended.IsZero() {
		t.Fatalf("the watch saw the target %s a ready endpoint at %s and the source %s end at %s", targetPod, targetReady, sourcePod, ended)
	}
	took := ended.Sub(targetReady)
	t.Logf("the source pod ended %s after the target pod was a ready endpoint (at most %s)", took.Round(time.Millisecond), sourceLeavesWithin)
	if took > sourceLeavesWithin {
		t.Errorf("the source pod %s ended %s after the target pod %s was a ready endpoint, want at most %s", sourcePod, took, targetPod, sourceLeavesWithin)
	}
	var agentLog string
	for name, l := range real.ContainerLogs(5000) {
		if strings.Contains(name, "lifeboat-agent") && strings.HasSuffix(name, "/agent") {
			agentLog = criLogContent(l)
		}
	}
	started := logTimesIn(strings.NewReader(agentLog), podnetwork.MsgForwarding, vmiName)
	stopped := logTimesIn(strings.NewReader(agentLog), podnetwork.MsgForwardEnded, vmiName)
	if len(started) != 1 || len(stopped) != 1 {
		t.Fatalf("the source agent logged %d starts and %d ends of the forward, want one of each", len(started), len(stopped))
	}
	forward := stopped[0].Sub(started[0])
	t.Logf("the source pod forwarded for %s", forward.Round(time.Millisecond))
	if forward >= agent.ForwardAtMost {
		t.Errorf("the source pod forwarded for %s, its bound: the EndpointSlices kept listing it", forward)
	}
}

// criLogContent is what the container wrote, from a container log as the kubelet keeps it: each
// line "<time> <stream> <P|F> <content>" (the CRI log format).
func criLogContent(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		if f := strings.SplitN(line, " ", 4); len(f) == 4 {
			b.WriteString(f[3])
		}
	}
	return b.String()
}

// TestRealNodePressureShutsTheVMDownWithTheGateOff: the same eviction with the feature gate off
// is today's behaviour: the guest is shut down through ACPI, the VMI ends and is never marked,
// although another node could take it.
func TestRealNodePressureShutsTheVMDownWithTheGateOff(t *testing.T) {
	real, _, vmi, _ := realVM(t, false)
	sourcePod := launcherPod(t, vmi)
	crossSoftThreshold(t, real)
	evicted := kubeletEviction(t, sourcePod, 2*time.Minute)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, realConsolePath(real, sourcePod), protocol.PowerButton); err != nil {
		t.Fatalf("want a graceful shutdown: %v", err)
	}
	v := waitVMI(t, vmi.Namespace, vmi.Name, time.Minute, "a final phase", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase.Terminal()
	})
	if v.Status.EvacuationNodeName != "" || v.Status.NodeName != real.Name() {
		t.Errorf("a VM shut down with the gate off is never marked nor moved: %s", describe(v))
	}
	migrations, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(vmi.Namespace).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(migrations.Items) != 0 {
		t.Errorf("with the gate off no migration is made: %v, %d", err, len(migrations.Items))
	}
	sourceExitedCleanly(t, sourcePod, evicted, func(ctx context.Context) (*corev1.Pod, error) {
		return cluster.Kube.CoreV1().Pods(sourcePod.Namespace).Get(ctx, sourcePod.Name, metav1.GetOptions{})
	})
}
