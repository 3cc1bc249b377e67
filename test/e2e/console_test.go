package e2e

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// consoleSession is `kubectl lifeboat console` running through the real kubectl, with its stdin
// and stdout in the test's hands.
type consoleSession struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	ended  chan error
	stderr strings.Builder // complete once ended has its value
}

func startConsole(t *testing.T, args ...string) *consoleSession {
	t.Helper()
	cmd := kubectlLifeboatCommand(append([]string{"console"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &consoleSession{cmd: cmd, stdin: stdin, lines: make(chan string, 1024), ended: make(chan error, 1)}
	cmd.Stderr = &s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r := bufio.NewScanner(out)
		for r.Scan() {
			select {
			case s.lines <- r.Text():
			default: // nobody reads any more; the test has what it wanted
			}
		}
		close(s.lines)
		err := cmd.Wait()
		t.Logf("kubectl lifeboat console %s ended (%v); stderr:\n%s", strings.Join(args, " "), err, s.stderr.String())
		s.ended <- err
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return s
}

// waitLine waits for a line of the session's output that contains want.
func (s *consoleSession) waitLine(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	var seen []string
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				t.Fatalf("the console session ended before printing %q; it printed:\n%s", want, strings.Join(seen, "\n"))
			}
			if strings.Contains(line, want) {
				return
			}
			seen = append(seen, line)
		case <-deadline:
			t.Fatalf("no line with %q from the console within %s; it printed:\n%s", want, timeout, strings.Join(seen, "\n"))
		}
	}
}

func (s *consoleSession) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-s.ended:
		return err
	case <-time.After(timeout):
		t.Fatalf("the console session did not end within %s", timeout)
		return nil
	}
}

// A user reaches the guest's serial console of a VM on a real kubelet with `kubectl lifeboat
// console`, through the launcher pod's pods/exec: what they type reaches the guest and its answer
// comes back; a second session is refused while one is open; a user without pods/exec is refused
// with a message that says which permission it takes.
func TestKubectlLifeboatConsoleReachesTheGuest(t *testing.T) {
	real := startRealNode(t)
	deployLifeboat(t, real)
	setConfig(t, true)
	ns := testNamespace(t)
	vmi, _ := realNodeVM(t, real, ns, "console")

	first := startConsole(t, vmi.Name, "-n", ns)
	if _, err := io.WriteString(first.stdin, "hello from the console\n"); err != nil {
		t.Fatal(err)
	}
	first.waitLine(t, protocol.Heard("hello from the console"), time.Minute)
	first.waitLine(t, protocol.CounterPrefix, 30*time.Second) // the guest's own output goes on arriving

	second := startConsole(t, vmi.Name, "-n", ns)
	if err := second.wait(t, time.Minute); err == nil || !strings.Contains(second.stderr.String(), "another console session is open") {
		t.Errorf("a second console session while one is open: %v, %q; want it refused, saying another session is open", err, second.stderr.String())
	}
	// The first session still works, and ends with its stdin.
	if _, err := io.WriteString(first.stdin, "still here\n"); err != nil {
		t.Fatal(err)
	}
	first.waitLine(t, protocol.Heard("still here"), 30*time.Second)
	first.stdin.Close()
	if err := first.wait(t, 30*time.Second); err != nil {
		t.Errorf("the console session ended with %v when its stdin closed, want success", err)
	}

	// A namespace user who may read VMIs and pods but not exec into them.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "vm-viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"virtualmachineinstances"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
	}}
	if _, err := cluster.Kube.RbacV1().Roles(ns).Create(context.Background(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vm-viewer"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "vm-viewer"}}}
	if _, err := cluster.Kube.RbacV1().RoleBindings(ns).Create(context.Background(), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const refusal = "it takes create on pods/exec in namespace "
	var out string
	// The authorizer sees the new RoleBinding a moment after it is stored; until then the refusal
	// is for reading the VMI.
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		out, err = kubectlLifeboat(t, "console", vmi.Name, "-n", ns, "--as", "vm-viewer")
		return err != nil && strings.Contains(out, refusal+ns), nil
	})
	if err != nil {
		t.Fatalf("a user without pods/exec within 30s: %s; want a refusal saying %q", out, refusal+ns)
	}
}
