package node

import (
	"context"
	"fmt"
	"os"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Node is a running emulated node.
type Node struct {
	cfg         Config
	layout      layout
	network     *nodeNetwork
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	pods        *podController
	freezer     *freezer
	// cpuGroup is the cpu cgroup of the node's containers (Config.PodCPUShares), or "".
	cpuGroup string
	kubelet  *kubeletAPI

	cancel     context.CancelFunc
	background sync.WaitGroup
	stopOnce   sync.Once
}

// Start registers the node and runs the pods bound to it until Stop. ctx bounds the start-up
// only; its values (a logger, say) stay with the node. On error nothing is left running.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("configuring node %s: %w", cfg.Name, err)
	}
	if err := os.MkdirAll(cfg.RootDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the root directory of node %s: %w", cfg.Name, err)
	}
	ctx = klog.NewContext(ctx, cfg.Logger)
	n := &Node{cfg: cfg, layout: newLayout(cfg), freezer: newFreezer()}
	if cfg.Network != nil {
		nn, err := cfg.Network.node()
		if err != nil {
			return nil, err
		}
		n.network = &nn
	}
	// The kubelet API listens before the node registers: the Node publishes its port.
	if n.kubelet, err = listenKubeletAPI(ctx, cfg); err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	n.cfg.KubeletPort = n.kubelet.port()
	n.kubelet.freezer = n.freezer
	if err := n.register(ctx); err != nil {
		n.kubelet.close()
		return nil, err
	}

	if cfg.PodCPUShares != 0 {
		if n.cpuGroup, err = newCPUGroup(cfg.Name, cfg.PodCPUShares); err != nil {
			n.kubelet.close()
			return nil, fmt.Errorf("node %s: %w", cfg.Name, err)
		}
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = cancel
	n.broadcaster = record.NewBroadcaster(record.WithContext(runCtx))
	n.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Client.CoreV1().Events("")})
	n.recorder = n.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.Name})
	if n.pods, err = newPodController(cfg.Client, cfg, n.layout, n.recorder, n.network, n.cpuGroup); err != nil {
		if n.cpuGroup != "" {
			_ = os.Remove(n.cpuGroup)
		}
		cancel()
		n.broadcaster.Shutdown()
		n.kubelet.close()
		return nil, err
	}
	n.pods.freezer = n.freezer
	n.background.Go(func() { n.runLease(runCtx) })
	n.background.Go(func() { n.runStatus(runCtx) })
	if err := n.pods.start(ctx, runCtx); err != nil {
		n.Stop()
		return nil, err
	}
	n.kubelet.serve(n.pods.pods, n.pods.runtime, n.layout)
	// The kubelet names its Node in events by name, with the name as UID too.
	nodeRef := &corev1.ObjectReference{Kind: "Node", Name: cfg.Name, UID: types.UID(cfg.Name)}
	n.recorder.Eventf(nodeRef, corev1.EventTypeNormal, "Starting", "Starting kubelet.")
	cfg.Logger.Info("Node started", "address", cfg.Address, "kubeletPort", n.cfg.KubeletPort, "root", cfg.RootDir)
	return n, nil
}

// Stop ends everything the node runs: the processes of its pods are killed at once, as when
// a machine fails, and its heartbeats and watches end. The Node object stays, as it does when
// a kubelet stops: the node lifecycle controller marks it NotReady once the lease expires.
// Stop may be called more than once.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		n.kubelet.close()
		n.cancel()
		n.pods.stop()
		n.background.Wait()
		n.pods.runtime.shutdown()
		if n.cpuGroup != "" {
			if err := removeCPUGroup(n.cpuGroup); err != nil {
				n.cfg.Logger.Error(err, "Leaving a cgroup behind")
			}
		}
		n.broadcaster.Shutdown()
		n.cfg.Logger.Info("Node stopped")
	})
}

// Name is the Node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Address is the node's InternalIP, also the IP of its pods.
func (n *Node) Address() string { return n.cfg.Address }

// KubeletPort is the port of the node's kubelet API on Address, which its Node publishes.
func (n *Node) KubeletPort() int { return n.cfg.KubeletPort }

// RootDir holds the node's private host paths and its pods' logs and volumes.
func (n *Node) RootDir() string { return n.cfg.RootDir }

// HostPath is where path, a host path on this node (that of a hostPath volume, say), is on
// this machine: under RootDir for the node's private host paths, path itself otherwise.
func (n *Node) HostPath(path string) string { return n.layout.hostPath(path) }

// ImageRoot is where the node unpacked the image named ref for image volumes, or "" if no pod
// of it has used that image yet.
func (n *Node) ImageRoot(ref string) string { return n.layout.images.known(ref) }
