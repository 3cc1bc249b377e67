package node

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"k8s.io/client-go/tools/clientcmd"
)

// ServiceProxy is kube-proxy routing the cluster's Services for the pods of a Network: one
// instance in the fabric, through which every node's pod traffic passes, where a real cluster
// runs one on each node.
type ServiceProxy struct {
	cmd     *exec.Cmd
	done    chan struct{}
	fwd     net.Listener
	wg      sync.WaitGroup
	LogPath string
}

// kubeProxyConfig is kube-proxy's configuration: iptables mode; every Service connection
// masqueraded, so that a pod reached through a Service on its own node's bridge answers
// through the fabric (no br_netfilter needed); rules written at once on every change, as the
// test of a migration's interruption must not measure kube-proxy's default 1 s batching; conntrack left as the
// machine has it (a namespace cannot change its limits).
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %s
mode: iptables
clusterCIDR: %s
iptables:
  masqueradeAll: true
  minSyncPeriod: 10ms
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
  min: 0
`

// StartServiceProxy runs the kube-proxy binary in the fabric with kubeconfig, whose API server
// must be on this machine's loopback: the fabric reaches it through a forwarder at the same
// address, so the kubeconfig works unchanged there. It runs as the node nodeName's (kube-proxy
// waits for its Node to exist). Stop ends it.
func (n *Network) StartServiceProxy(binary, kubeconfig, nodeName string) (*ServiceProxy, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("the API server %s is not on the loopback address the fabric can be given", cfg.Host)
	}
	p := &ServiceProxy{done: make(chan struct{}), LogPath: filepath.Join(n.dir, "kube-proxy.log")}
	if err := n.Do(func() error {
		var err error
		p.fwd, err = net.Listen("tcp", u.Host)
		return err
	}); err != nil {
		return nil, fmt.Errorf("forwarding the API server into the fabric: %w", err)
	}
	p.wg.Go(func() { forward(p.fwd, u.Host) })

	config := filepath.Join(n.dir, "kube-proxy.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, kubeProxyConfig, kubeconfig, nodeName, PodNetworkPrefix), 0o644); err != nil {
		p.fwd.Close()
		return nil, err
	}
	log, err := os.Create(p.LogPath)
	if err != nil {
		p.fwd.Close()
		return nil, err
	}
	p.cmd = exec.Command("nsenter", "--net="+n.fabric, binary, "--config", config, "--v=2")
	p.cmd.Stdout, p.cmd.Stderr = log, log
	// A test binary killed by its timeout must not leave it behind.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		log.Close()
		p.fwd.Close()
		return nil, fmt.Errorf("starting kube-proxy: %w", err)
	}
	go func() {
		_ = p.cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// Stop ends kube-proxy and the forwarder.
func (p *ServiceProxy) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	p.fwd.Close()
	p.wg.Wait()
}

// forward copies every connection l accepts to target, dialled from the caller's namespace.
func forward(l net.Listener, target string) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer in.Close()
			out, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(out, in)
				out.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(in, out)
			in.(*net.TCPConn).CloseWrite()
			<-done
		})
	}
}
