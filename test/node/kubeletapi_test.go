package node

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"
)

// TestKubectlLogs: kubectl logs, through the API server, reads a container's log from its node,
// with --tail, --previous and --follow.
func TestKubectlLogs(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]

	n, err := cluster.Kube.CoreV1().Nodes().Get(t.Context(), node.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Status.DaemonEndpoints.KubeletEndpoint.Port; got == 0 || int(got) != node.KubeletPort() {
		t.Errorf("the Node publishes kubelet port %d, want the one it serves, %d", got, node.KubeletPort())
	}

	// The first run fails after a line; the second writes three and stays.
	work := filepath.Join(t.TempDir(), "work")
	pod := shPod(node, "talker", fmt.Sprintf(`if [ -e %[1]s/ran ]; then echo one; echo two; echo three; exec sleep 3600; fi; touch %[1]s/ran; echo first run; exit 1`, work))
	pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: work}}
	pod = createPod(t, ns, pod)
	waitForPod(t, ns, pod.Name, "restarted once and Ready", func(p *corev1.Pod) bool {
		return isReady(p) && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	pod, _ = cluster.Kube.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{})
	waitForLog(t, node, pod, "main", "one\ntwo\nthree\n")

	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "one\ntwo\nthree\n"},
		{[]string{"--tail=2"}, "two\nthree\n"},
		{[]string{"--tail=0"}, ""},
		{[]string{"--limit-bytes=6"}, "one\ntw"},
		{[]string{"--previous"}, "first run\n"},
		{[]string{"-c", "main", "--tail=-1"}, "one\ntwo\nthree\n"},
	} {
		out, err := cluster.Kubectl(t.Context(), append([]string{"logs", "-n", ns, pod.Name}, c.args...)...)
		if err != nil {
			t.Errorf("kubectl logs %v: %v", c.args, err)
		} else if out != c.want {
			t.Errorf("kubectl logs %v = %q, want %q", c.args, out, c.want)
		}
	}
	if out, err := cluster.Kubectl(t.Context(), "logs", "-n", ns, pod.Name, "--timestamps"); err == nil || !strings.Contains(out, "timestamps") {
		t.Errorf("kubectl logs --timestamps: want a refusal that names timestamps, got %q, %v", out, err)
	}

	// --follow streams what the container writes until it exits.
	follower := shPod(node, "follower", `for i in 1 2 3; do echo line $i; sleep 0.3; done`)
	follower = createPod(t, ns, follower)
	waitForPod(t, ns, follower.Name, "started", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting == nil
	})
	out, err := cluster.Kubectl(t.Context(), "logs", "-n", ns, "-f", follower.Name)
	if err != nil {
		t.Fatalf("kubectl logs -f: %v", err)
	}
	if want := "line 1\nline 2\nline 3\n"; out != want {
		t.Errorf("kubectl logs -f = %q, want %q", out, want)
	}
}

// TestKubectlExec: kubectl exec, through the API server, runs a command in a running container:
// in its mount and PID namespaces, as its user, with its environment; with stdin, and with the
// command's exit code as kubectl's. A terminal, as kubectl exec -t asks, is the command's own.
func TestKubectlExec(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	// The container's user reaches its mount path.
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	pod := shPod(node, "target", fmt.Sprintf(`echo inside > %s/mark; exec sleep 3600`, data))
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1234), RunAsGroup: ptr.To[int64](1234), FSGroup: ptr.To[int64](1234)}
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GREETING", Value: "hello from the container"}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: data}}
	pod = createPod(t, ns, pod)
	pod = waitForPod(t, ns, pod.Name, "Ready", isReady)

	// The emptyDir is mounted in the container's mount namespace only, and the command is in its
	// PID namespace too: /proc is the container's, and has the command's own entry.
	proc, _ := node.pods.runtime.running(pod, "main")
	if proc == nil {
		t.Fatal("the container does not run")
	}
	pidNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", proc.pid()))
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`for i in 1 2 3 4 5 6 7 8 9 10; do [ -e %s/mark ] && break; sleep 0.2; done; cat %[1]s/mark; echo "$GREETING"; id -u; readlink /proc/self/ns/pid`, data)
	out, err := cluster.Kubectl(t.Context(), "exec", "-n", ns, pod.Name, "--", "sh", "-c", script)
	if err != nil {
		t.Fatalf("kubectl exec: %v", err)
	}
	if want := "inside\nhello from the container\n1234\n" + pidNS + "\n"; out != want {
		t.Errorf("kubectl exec printed %q, want the container's mark, its environment, its user and its PID namespace: %q", out, want)
	}

	// Standard input, and the exit code.
	cmd := exec.CommandContext(t.Context(), cluster.Binaries.Kubectl, "--kubeconfig", cluster.Kubeconfig,
		"exec", "-i", "-n", ns, pod.Name, "--", "sh", "-c", "tr a-z A-Z; echo to stderr >&2; exit 3")
	cmd.Stdin = strings.NewReader("shout\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Errorf("kubectl exec of a command that exits 3: %v, want exit code 3 (stderr %q)", err, stderr.String())
	}
	if stdout.String() != "SHOUT\n" || !strings.Contains(stderr.String(), "to stderr") {
		t.Errorf("kubectl exec -i: stdout %q, stderr %q; want SHOUT and the command's stderr", stdout.String(), stderr.String())
	}

	// An unknown command, and a container that does not run.
	if out, err := cluster.Kubectl(t.Context(), "exec", "-n", ns, pod.Name, "--", "no-such-command"); err == nil || !strings.Contains(out, "no-such-command") {
		t.Errorf("kubectl exec of an unknown command: %v: %s", err, out)
	}

	// A terminal: the command's stdin and stdout are one, its controlling terminal.
	req := cluster.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: "main", Command: []string{"sh", "-c", `tty; test -t 0 && test -t 1 && echo terminal
				# The size follows the start, from the client.
				for i in $(seq 50); do [ "$(stty size)" != "0 0" ] && break; sleep 0.1; done; stty size`},
			Stdin: true, Stdout: true, TTY: true,
		}, scheme.ParameterCodec)
	executor, err := remotecommand.NewSPDYExecutor(cluster.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var terminal bytes.Buffer
	sizes := &fixedSize{size: remotecommand.TerminalSize{Width: 100, Height: 42}}
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	err = executor.StreamWithContext(t.Context(), remotecommand.StreamOptions{Stdin: stdinR, Stdout: &terminal, Tty: true, TerminalSizeQueue: sizes})
	if err != nil {
		t.Fatalf("exec with a terminal: %v (output %q)", err, terminal.String())
	}
	if got := terminal.String(); !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "terminal") || !strings.Contains(got, "42 100") {
		t.Errorf("exec with a terminal printed %q, want a /dev/pts terminal sized 42 100", got)
	}

	// A caller who leaves hangs the terminal up: its command gets SIGHUP (129 = 128+1).
	req = cluster.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"sleep", "3600"}, Stdin: true, Stdout: true, TTY: true}, scheme.ParameterCodec)
	if executor, err = remotecommand.NewSPDYExecutor(cluster.Config, "POST", req.URL()); err != nil {
		t.Fatal(err)
	}
	leaving, left := io.Pipe()
	time.AfterFunc(time.Second, func() { left.Close() })
	start := time.Now()
	err = executor.StreamWithContext(t.Context(), remotecommand.StreamOptions{Stdin: leaving, Stdout: io.Discard, Tty: true})
	if err == nil || !strings.Contains(err.Error(), "exit code 129") || time.Since(start) > 30*time.Second {
		t.Errorf("exec of sleep on a terminal whose caller left: %v after %s; want exit code 129 at once", err, time.Since(start).Round(time.Millisecond))
	}
}

// fixedSize reports one terminal size, and then that there are no more.
type fixedSize struct {
	size remotecommand.TerminalSize
	sent bool
}

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	if f.sent {
		return nil
	}
	f.sent = true
	return &f.size
}

// TestKubeletAPIAuthenticatesAndAuthorizes: the node's kubelet API serves a caller with a client
// certificate of the cluster's client CA whom the API server allows nodes/proxy, and no one else:
// 401 without a certificate, a failed handshake with one of another CA, 403 for a user without
// the right.
func TestKubeletAPIAuthenticatesAndAuthorizes(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	pod := createPod(t, ns, shPod(node, "quiet", `echo secret; exec sleep 3600`))
	waitForPod(t, ns, pod.Name, "Ready", isReady)
	pod, _ = cluster.Kube.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{})
	waitForLog(t, node, pod, "main", "secret\n")

	url := fmt.Sprintf("https://%s/containerLogs/%s/%s/main", net.JoinHostPort(node.Address(), strconv.Itoa(node.KubeletPort())), ns, pod.Name)
	get := func(cert *tls.Certificate) (int, string, error) {
		cfg := &tls.Config{InsecureSkipVerify: true} // The node's serving certificate is self-signed.
		if cert != nil {
			// Sent whoever signed it, and whatever CAs the server names.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
		defer client.CloseIdleConnections()
		resp, err := client.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}

	if status, body, err := get(nil); err != nil || status != http.StatusUnauthorized {
		t.Errorf("without a client certificate: %d %q, %v; want 401", status, body, err)
	}
	stranger := selfSignedClientCert(t, "lifeboat-admin")
	if status, body, err := get(&stranger); err == nil {
		t.Errorf("with a certificate of another CA: %d %q; want the handshake refused", status, body)
	}
	nobody, err := cluster.ClientCertificate("nobody")
	if err != nil {
		t.Fatal(err)
	}
	if status, body, err := get(&nobody); err != nil || status != http.StatusForbidden || !strings.Contains(body, "user=nobody") {
		t.Errorf("as a user without nodes/proxy: %d %q, %v; want 403 naming the user", status, body, err)
	}
	admin, err := cluster.ClientCertificate("someone-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	if status, body, err := get(&admin); err != nil || status != http.StatusOK || body != "secret\n" {
		t.Errorf("as a cluster admin: %d %q, %v; want 200 and the log", status, body, err)
	}
}

// selfSignedClientCert is a client certificate for user that no CA of the cluster signed.
func selfSignedClientCert(t *testing.T, user string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: user},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
