// Package controlplane runs a real, local Kubernetes control plane for lifeboat's tests and demo:
// etcd, kube-apiserver (with the EvictionRequest API served), kube-controller-manager and
// kube-scheduler, built from pinned Go modules, listening on loopback with TLS, with
// lifeboat's CRDs installed.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	lifeboat "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
)

const (
	dirPattern = "lifeboat-cp-*"
	ownerFile  = "owner.pid"
	// The service range is only allocated from; nothing here routes to it.
	serviceCIDR = "10.96.0.0/24"
	serviceIP   = "10.96.0.1"
)

// Options choose what runs. The zero value runs everything.
type Options struct {
	// Dir holds certificates, data and logs. Empty means a new temporary directory.
	// The directory is removed by Stop either way.
	Dir string
	// WithoutControllerManager and WithoutScheduler leave those components out, for tests
	// that need only the API server and want it sooner.
	WithoutControllerManager bool
	WithoutScheduler         bool
	// CRDDir holds the CRDs to install; empty means manifests/crds in the checkout.
	CRDDir string
	// Stock runs the API server as clusters people run have it, with nothing set for lifeboat: no
	// AdmissionConfiguration (it presents no client certificate to webhooks), no EvictionRequest
	// API, and no CRDs installed.
	Stock bool
	// Progress receives build and start-up messages; nil discards them.
	Progress io.Writer
}

// ControlPlane is a running local control plane.
type ControlPlane struct {
	// Dir holds the control plane's files, its component logs (<name>.log) among them.
	Dir string
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	// Config is the admin REST configuration.
	Config *rest.Config
	// Kube and Lifeboat are admin clients.
	Kube     kubernetes.Interface
	Lifeboat lifeboat.Interface
	// Binaries are the commands it runs, kubectl among them.
	Binaries Binaries
	// Host is the API server's URL.
	Host string
	// WebhookAddressWithoutClientCert is a loopback host:port at which the API server presents
	// no client certificate to a webhook, as an API server without an AdmissionConfiguration
	// (kubeadm's, k3s's, a managed one's) presents none to any: a test serves its webhook there
	// to be called as on such a cluster. Everywhere else the API server presents its webhook
	// client certificate.
	WebhookAddressWithoutClientCert string

	pki pki
	// mu guards procs: a test may kill and start a component again while others read them.
	mu    sync.Mutex
	procs []*Process
	// serviceAccounts: the controller manager runs and gives each namespace its default one.
	serviceAccounts bool
}

// Start builds the binaries if they are not cached, starts the components and waits until the
// API server is ready, the CRDs are Established and (with the controller manager) the default
// service account exists, so that pods can be created at once. On error nothing is left running.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	bins, err := EnsureBinaries(ctx, progress)
	if err != nil {
		return nil, err
	}
	crdDir := opts.CRDDir
	if crdDir == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		crdDir = filepath.Join(root, "manifests", "crds")
	}
	_ = sweepStale(os.TempDir())

	dir := opts.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", dirPattern); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	cp := &ControlPlane{Dir: dir, Binaries: bins, serviceAccounts: !opts.WithoutControllerManager}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if cp.pki, err = newPKI(dir); err != nil {
		return nil, fmt.Errorf("creating certificates: %w", err)
	}

	etcdURL, err := cp.startEtcd()
	if err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(etcdURL, opts.Stock); err != nil {
		return nil, err
	}
	if err := cp.writeKubeconfig(); err != nil {
		return nil, err
	}
	if err := cp.waitReady(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "kube-apiserver ready at %s\n", cp.Host)
	if !opts.WithoutControllerManager {
		if err := cp.startControllerManager(); err != nil {
			return nil, err
		}
	}
	if !opts.WithoutScheduler {
		if err := cp.startScheduler(); err != nil {
			return nil, err
		}
	}
	if !opts.Stock {
		if err := cp.InstallCRDs(ctx, crdDir); err != nil {
			return nil, err
		}
		// lifeboat's own namespace, where its signer keeps the migration CA, as an install makes it.
		if err := cp.ensureNamespace(ctx, LifeboatNamespace); err != nil {
			return nil, err
		}
	}
	if err := cp.bindKubeletClient(ctx); err != nil {
		return nil, err
	}
	if !opts.WithoutControllerManager {
		if err := cp.waitDefaultServiceAccount(ctx, "default"); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// LifeboatNamespace is lifeboat's namespace (manifests/namespace.yaml).
const LifeboatNamespace = "lifeboat-system"

func (cp *ControlPlane) ensureNamespace(ctx context.Context, name string) error {
	_, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// kubeletClientBinding lets the API server's kubelet client identity use the kubelet API, as
// kubeadm binds it: a kubelet asks the API server (a SubjectAccessReview) whether its caller may.
const kubeletClientBinding = "lifeboat-test:apiserver-kubelet-client"

func (cp *ControlPlane) bindKubeletClient(ctx context.Context) error {
	_, err := cp.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: kubeletClientBinding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: KubeletClientName}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding the API server's kubelet client to system:kubelet-api-admin: %w", err)
	}
	return nil
}

// Stop ends every component and removes the control plane's directory.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].Stop(10 * time.Second)
	}
	cp.procs = nil
	if cp.Dir != "" {
		_ = os.RemoveAll(cp.Dir)
	}
}

// Kubectl runs the built kubectl against the control plane and returns its combined output.
func (cp *ControlPlane) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, cp.Binaries.Kubectl, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// LogTail returns the end of a component's log ("etcd", "kube-apiserver", ...), for failure messages.
func (cp *ControlPlane) LogTail(component string) string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, p := range cp.procs {
		if p.name == component {
			return p.LogTail()
		}
	}
	return ""
}

func (cp *ControlPlane) start(name, path string, args ...string) (*Process, error) {
	p, err := StartProcess(cp.Dir, name, path, args...)
	if p != nil {
		cp.mu.Lock()
		cp.procs = append(cp.procs, p)
		cp.mu.Unlock()
	}
	return p, err
}

// Kill ends a component ("etcd", "kube-apiserver", ...) at once, as a crash would; StartAgain
// starts it again. Every client of the control plane meets the outage: only a test that has it
// to itself (the tests of a package run one at a time) may.
func (cp *ControlPlane) Kill(component string) error {
	p := cp.component(component)
	if p == nil {
		return fmt.Errorf("the control plane has no component %s", component)
	}
	p.Kill()
	return nil
}

// StartAgain starts a killed component again with its command line (its ports, its data) and
// waits until the API server is ready. A port another process took meanwhile makes it exit at
// once: it is tried a few times.
func (cp *ControlPlane) StartAgain(ctx context.Context, component string) error {
	old := cp.component(component)
	if old == nil {
		return fmt.Errorf("the control plane has no component %s", component)
	}
	if !old.Exited() {
		return fmt.Errorf("%s still runs", component)
	}
	var err error
	for range 3 {
		var p *Process
		if p, err = StartProcessWithEnv(cp.Dir, component, old.cmd.Env, old.cmd.Path, old.cmd.Args[1:]...); err != nil {
			return err
		}
		cp.mu.Lock()
		for i := range cp.procs {
			if cp.procs[i] == old {
				cp.procs[i] = p
			}
		}
		cp.mu.Unlock()
		old = p
		if err = cp.waitReady(ctx); err == nil || !p.Exited() {
			return err
		}
	}
	return err
}

// component is the running or last run process of the named component; nil if none.
func (cp *ControlPlane) component(name string) *Process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, p := range cp.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

func (cp *ControlPlane) startEtcd() (string, error) {
	ports, err := FreePorts(2)
	if err != nil {
		return "", err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	_, err = cp.start("etcd", cp.Binaries.Etcd,
		"--data-dir", filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer,
		// Test data need not survive a power cut; fsync would dominate start-up and every write.
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	return client, err
}

func (cp *ControlPlane) startAPIServer(etcdURL string, stock bool) error {
	ports, err := FreePorts(1)
	if err != nil {
		return err
	}
	cp.Host = fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	var lifeboats []string
	if !stock {
		admission, err := cp.writeAdmissionConfig()
		if err != nil {
			return err
		}
		lifeboats = []string{
			"--feature-gates", "EvictionRequestAPI=true",
			"--runtime-config", "lifecycle.k8s.io/v1alpha1=true",
			"--admission-control-config-file", admission,
		}
	}
	_, err = cp.start("kube-apiserver", cp.Binaries.APIServer, append([]string{
		"--etcd-servers", etcdURL,
		// The default reconciler refuses loopback addresses, and nothing here routes to the
		// kubernetes Service anyway.
		"--endpoint-reconciler-type", "none",
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[0]),
		"--tls-cert-file", cp.pki.ServingCert,
		"--tls-private-key-file", cp.pki.ServeKey,
		"--client-ca-file", cp.pki.CACert,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", cp.pki.SAPub,
		"--service-account-signing-key-file", cp.pki.SAKey,
		"--service-cluster-ip-range", serviceCIDR,
		"--authorization-mode", "Node,RBAC",
		// Nodes' names resolve nowhere here; kubeadm's clusters prefer the InternalIP too. The API
		// server dials the kubelet for exec, logs and port-forward.
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		// Kubelets authenticate the API server by this certificate, as kubeadm's do; without it
		// the API server would reach them anonymously. Their serving certificates are their own,
		// unverified, as by default (no --kubelet-certificate-authority).
		"--kubelet-client-certificate", cp.pki.KubeletClientCert,
		"--kubelet-client-key", cp.pki.KubeletClientKey,
		// Launcher pods are privileged (libvirtd's mount namespace, /dev/kvm), as in kubeadm's clusters.
		"--allow-privileged=true",
		"--cert-dir", filepath.Join(cp.Dir, "apiserver-certs"),
	}, lifeboats...)...)
	return err
}

// admissionConfig makes the API server present its webhook client certificate to every webhook
// (a kubeconfig user named "*"), so that a webhook can tell the API server from other callers.
const admissionConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]q
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]q
`

// webhookKubeconfig: an exact host:port match wins over "*" (k8s.io/apiserver's
// defaultAuthenticationInfoResolver), so the user named for WebhookAddressWithoutClientCert, with
// no credentials, leaves that address without a client certificate.
const webhookKubeconfig = `apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: %q
    client-key: %q
- name: %q
  user: {}
`

func (cp *ControlPlane) writeAdmissionConfig() (string, error) {
	port, err := portBelowEphemeral()
	if err != nil {
		return "", err
	}
	cp.WebhookAddressWithoutClientCert = fmt.Sprintf("127.0.0.1:%d", port)
	kubeconfig := filepath.Join(cp.Dir, "webhook-client.kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, webhookKubeconfig, cp.pki.WebhookCert, cp.pki.WebhookKey, cp.WebhookAddressWithoutClientCert), 0o600); err != nil {
		return "", err
	}
	path := filepath.Join(cp.Dir, "admission.yaml")
	return path, os.WriteFile(path, fmt.Appendf(nil, admissionConfig, kubeconfig), 0o600)
}

// CAFile is the cluster CA's certificate: it signs the API server's certificates, its client
// certificate for webhooks included, and is the ca.crt of every service account token volume.
func (cp *ControlPlane) CAFile() string { return cp.pki.CACert }

func (cp *ControlPlane) startControllerManager() error {
	_, err := cp.start("kube-controller-manager", cp.Binaries.ControllerManager,
		"--kubeconfig", cp.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file", cp.pki.SAKey,
		"--root-ca-file", cp.pki.CACert,
		"--cluster-signing-cert-file", cp.pki.CACert,
		"--cluster-signing-key-file", cp.pki.CAKey,
	)
	return err
}

func (cp *ControlPlane) startScheduler() error {
	_, err := cp.start("kube-scheduler", cp.Binaries.Scheduler,
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig,
		"--authorization-kubeconfig", cp.Kubeconfig,
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
		"--secure-port=0",
	)
	return err
}

func (cp *ControlPlane) writeKubeconfig() error {
	caData, err := os.ReadFile(cp.pki.CACert)
	if err != nil {
		return err
	}
	certData, err := os.ReadFile(cp.pki.AdminCert)
	if err != nil {
		return err
	}
	keyData, err := os.ReadFile(cp.pki.AdminKey)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lifeboat"] = &clientcmdapi.Cluster{Server: cp.Host, CertificateAuthorityData: caData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: certData, ClientKeyData: keyData}
	cfg.Contexts["lifeboat"] = &clientcmdapi.Context{Cluster: "lifeboat", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "lifeboat"
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, cp.Kubeconfig); err != nil {
		return err
	}
	if cp.Config, err = clientcmd.RESTConfigFromKubeConfig(mustRead(cp.Kubeconfig)); err != nil {
		return err
	}
	// Tests create objects in bursts; the client-side default of 5 QPS would make them crawl.
	cp.Config.QPS, cp.Config.Burst = 200, 400
	if cp.Kube, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return err
	}
	cp.Lifeboat, err = lifeboat.NewForConfig(cp.Config)
	return err
}

func mustRead(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}

// waitReady polls /readyz until it answers 200, failing early if a component has exited.
func (cp *ControlPlane) waitReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.exitedError(); err != nil {
			return false, err
		}
		var status int
		body, err := cp.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status).Raw()
		if err != nil || status != 200 {
			last = fmt.Sprintf("status %d: %v %s", status, err, body)
			return false, nil
		}
		return true, nil
	})
	if err != nil && cp.anyExited() {
		return err
	}
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver /readyz (last answer %s): %w\n%s", last, err, cp.LogTail("kube-apiserver"))
	}
	return nil
}

func (cp *ControlPlane) waitDefaultServiceAccount(ctx context.Context, namespace string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.exitedError(); err != nil {
			return false, err
		}
		_, err := cp.Kube.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", getOptions)
		return err == nil, nil
	})
	if err != nil && cp.anyExited() {
		return err
	}
	if err != nil {
		return fmt.Errorf("waiting for kube-controller-manager to create the default service account of namespace %s: %w\n%s",
			namespace, err, cp.LogTail("kube-controller-manager"))
	}
	return nil
}

func (cp *ControlPlane) anyExited() bool { return cp.exitedError() != nil }

// exitedError describes the first component that has exited, with the end of its log.
func (cp *ControlPlane) exitedError() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, p := range cp.procs {
		if p.Exited() {
			return p.ExitError()
		}
	}
	return nil
}

// FreePorts asks the kernel for unused loopback ports. They are released before use, so a
// race with another process is possible but brief; a component that loses it fails to start
// with a clear bind error in its log.
// portBelowEphemeral is a free loopback port below Linux's ephemeral range (32768 and up by
// default), kept for a later listener: a port chosen with :0, as FreePorts and every outgoing
// connection choose theirs, is never one of these.
func portBelowEphemeral() (int, error) {
	for range 100 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free loopback port between 20000 and 32000")
}

func FreePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errors.New("finding a free port"), err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
