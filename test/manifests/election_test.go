package manifests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/readiness"
)

// controllerProc is a lifeboat-controller replica run by a test.
type controllerProc struct {
	identity, log string
	cmd           *exec.Cmd
	done          chan struct{}
}

func startReplica(t *testing.T, kubeconfig, identity string, args ...string) *controllerProc {
	t.Helper()
	p := &controllerProc{identity: identity, log: filepath.Join(t.TempDir(), identity+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	// Without the signer, as manifests/controller.yaml runs it: the controller's service account
	// may not read the migration CA.
	p.cmd = exec.Command(filepath.Join(bins, "lifeboat-controller"), "--kubeconfig", kubeconfig, "--acceleration", "tcg", "--run=controllers",
		"--leader-elect", "--leader-election-identity", identity,
		// Short, so that the test sees a takeover soon; the defaults are 15s, 10s, 2s.
		"--leader-election-lease-duration", "4s", "--leader-election-renew-deadline", "3s", "--leader-election-retry-period", "500ms")
	p.cmd.Args = append(p.cmd.Args, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("log of %s:\n%s", identity, b)
		}
	})
	return p
}

func (p *controllerProc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// serviceAccountKubeconfig is a kubeconfig with a token of the service account, as its pod would get.
func serviceAccountKubeconfig(t *testing.T, sa string) string {
	t.Helper()
	token, err := cluster.Kube.CoreV1().ServiceAccounts("lifeboat-system").CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s: %v", sa, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cluster.Config.Host, CertificateAuthority: cluster.Config.CAFile, CertificateAuthorityData: cluster.Config.CAData}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: token.Status.Token}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa}
	cfg.CurrentContext = "local"
	path := filepath.Join(t.TempDir(), sa+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func leaseHolder(ctx context.Context) string {
	lease, err := cluster.Kube.CoordinationV1().Leases("lifeboat-system").Get(ctx, "lifeboat-controller", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// createVMIAndWaitForItsPod is what a leader does and a follower does not: the VMI controller
// gives a new VMI its launcher pod.
func createVMIAndWaitForItsPod(t *testing.T, ns, name string) {
	t.Helper()
	allowNodeDirectories(t, guestDir)
	ctx := context.Background()
	vmi, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs: 1, Memory: resource.MustParse("128Mi"),
			Boot: v1alpha1.BootSource{Kernel: guestDir + "/vmlinuz", Initrd: guestDir + "/initrd.gz"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(vmi.UID)})
		return err == nil && len(pods.Items) == 1, err
	})
	if err != nil {
		t.Fatalf("VMI %s/%s got no launcher pod from the leader: %v", ns, name, err)
	}
}

// Two replicas with the controller's own service account and RBAC: one leads and runs the
// controllers; when it crashes the other takes over; a replica stopped by SIGTERM hands the
// Lease back at once instead of making the next leader wait for it to expire.
func TestLeaderElection(t *testing.T) {
	install(t)
	ctx := context.Background()
	ns := testNamespace(t)
	kubeconfig := serviceAccountKubeconfig(t, controllerSA)
	replicas := map[string]*controllerProc{}
	for _, id := range []string{"replica-a", "replica-b"} {
		replicas[id] = startReplica(t, kubeconfig, id)
	}

	var leader string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		leader = leaseHolder(ctx)
		return replicas[leader] != nil, nil
	})
	if err != nil {
		t.Fatalf("no replica holds the Lease lifeboat-system/lifeboat-controller (holder %q): %v", leader, err)
	}
	createVMIAndWaitForItsPod(t, ns, "first")
	// The leader keeps the LifeboatConfig's Ready condition, reading the CRDs with its own RBAC
	// (these replicas serve no webhook, which the condition says).
	waitReadyCondition(t, metav1.ConditionFalse, readiness.ReasonWebhookNotServed, "replica "+leader+" leads and runs the controllers, but it serves no eviction webhook")
	follower := "replica-a"
	if leader == follower {
		follower = "replica-b"
	}
	if log := replicas[follower].logText(); strings.Contains(log, "started leading") {
		t.Fatalf("the follower %s runs the controllers too:\n%s", follower, log)
	}

	// A crash: the Lease is not released, so the follower takes it once it expires.
	_ = replicas[leader].cmd.Process.Kill()
	<-replicas[leader].done
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return leaseHolder(ctx) == follower, nil
	})
	if err != nil {
		t.Fatalf("%s did not take over the Lease after %s crashed (holder %q): %v", follower, leader, leaseHolder(ctx), err)
	}
	createVMIAndWaitForItsPod(t, ns, "second")
	waitReadyCondition(t, metav1.ConditionFalse, readiness.ReasonWebhookNotServed, "replica "+follower+" leads")

	// A graceful stop: the controllers stop, then the Lease is released, well within its duration.
	p := replicas[follower]
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit within 10s of SIGTERM", follower)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited with %d after SIGTERM, want 0", follower, code)
	}
	if h := leaseHolder(ctx); h != "" {
		t.Errorf("after %s stopped, the Lease is held by %q, want released", follower, h)
	}
	// It said so on its way out.
	waitReadyCondition(t, metav1.ConditionFalse, readiness.ReasonNoLeader, "replica "+follower+" stopped leading")
}

// waitReadyCondition waits for the LifeboatConfig's Ready condition with the status and reason,
// its message starting with prefix.
func waitReadyCondition(t *testing.T, status metav1.ConditionStatus, reason, prefix string) {
	t.Helper()
	var got *metav1.Condition
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		config, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionReady)
		return got != nil && got.Status == status && got.Reason == reason && strings.HasPrefix(got.Message, prefix), nil
	})
	if err != nil {
		t.Fatalf("the LifeboatConfig's Ready condition is not %s %s %q…: %+v", status, reason, prefix, got)
	}
}
