package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The teardown tests run this test binary again as a "user's test binary" whose TestMain is
// controlplane.Main, with a run of its tests that fails or hangs, and then check what that
// child left behind.
const (
	helperEnv    = "LIFEBOAT_CONTROLPLANE_HELPER" // "fail" or "hang"
	helperReport = "LIFEBOAT_CONTROLPLANE_REPORT"
)

var helperCluster *ControlPlane

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		Main(helperRun{hang: mode == "hang"}, &helperCluster, Options{WithoutControllerManager: true, WithoutScheduler: true})
		return
	}
	os.Exit(m.Run())
}

// helperRun stands for a user's tests: it reports where the control plane lives, then fails
// (exit code 1, as a failed test) or hangs (until the parent kills it).
type helperRun struct{ hang bool }

func (h helperRun) Run() int {
	if err := writeReport(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if h.hang {
		select {}
	}
	return 1
}

type report struct {
	Dir  string
	PIDs []int
}

// writeReport tells the parent test where the child's control plane lives.
func writeReport() error {
	b, err := os.ReadFile(filepath.Join(helperCluster.Dir, pidsFile))
	if err != nil {
		return err
	}
	r := report{Dir: helperCluster.Dir}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		r.PIDs = append(r.PIDs, pid)
	}
	out, _ := json.Marshal(r)
	path := os.Getenv(helperReport)
	if err := os.WriteFile(path+".tmp", out, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func startHelper(t *testing.T, mode string) (*exec.Cmd, string) {
	t.Helper()
	reportPath := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperReport+"="+reportPath)
	// The child fails on purpose; keep its output out of this test's unless this test fails.
	out, err := os.Create(filepath.Join(t.TempDir(), "helper.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("helper test binary output:\n%s", b)
		}
	})
	return cmd, reportPath
}

func readReport(t *testing.T, path string) report {
	t.Helper()
	var r report
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return false, nil
		}
		return true, json.Unmarshal(b, &r)
	})
	if err != nil {
		t.Fatalf("the helper test binary did not report its control plane within 2m: %v", err)
	}
	if len(r.PIDs) < 2 {
		t.Fatalf("want etcd and kube-apiserver pids in the report, got %v", r.PIDs)
	}
	return r
}

// assertGone waits until none of the pids runs and dir does not exist.
func assertGone(t *testing.T, r report) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, pid := range r.PIDs {
			if alive(pid) && !zombie(pid) {
				return false, nil
			}
		}
		_, err := os.Stat(r.Dir)
		return errors.Is(err, os.ErrNotExist), nil
	})
	if err != nil {
		var running []int
		for _, pid := range r.PIDs {
			if alive(pid) && !zombie(pid) {
				running = append(running, pid)
			}
		}
		_, statErr := os.Stat(r.Dir)
		t.Fatalf("want every component stopped and %s removed; still running: %v, stat: %v", r.Dir, running, statErr)
	}
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestStopRemovesEverything(t *testing.T) {
	cp, err := Start(context.Background(), Options{WithoutControllerManager: true, WithoutScheduler: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the API server does not answer: %v", err)
	}
	r := report{Dir: cp.Dir}
	for _, p := range cp.procs {
		r.PIDs = append(r.PIDs, p.cmd.Process.Pid)
	}
	cp.Stop()
	assertGone(t, r)
}

// A killed etcd or kube-apiserver started again serves what was written before, on the same
// address: clients need nothing new.
func TestAKilledComponentStartsAgain(t *testing.T) {
	ctx := context.Background()
	cp, err := Start(ctx, Options{WithoutControllerManager: true, WithoutScheduler: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cp.Kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, component := range []string{"kube-apiserver", "etcd"} {
		if err := cp.Kill(component); err != nil {
			t.Fatal(err)
		}
		down, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := cp.Kube.CoreV1().ConfigMaps("default").Get(down, "before", metav1.GetOptions{}); err == nil {
			t.Errorf("with %s killed, the API still answers", component)
		}
		cancel()
		if err := cp.StartAgain(ctx, component); err != nil {
			t.Fatalf("starting %s again: %v", component, err)
		}
		// etcd back: the API server reconnects within its retries.
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := cp.Kube.CoreV1().ConfigMaps("default").Get(ctx, "before", metav1.GetOptions{})
			return err == nil && got.Data["k"] == "v", nil
		})
		if err != nil {
			t.Fatalf("after %s started again, what was written before is not served: %v", component, err)
		}
	}
}

func TestTeardownAfterAFailingTest(t *testing.T) {
	cmd, path := startHelper(t, "fail")
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the helper's failing test should make it exit 1, got %v", err)
	}
	assertGone(t, readReport(t, path))
}

func TestKilledTestBinaryLeavesNothingBehind(t *testing.T) {
	cmd, path := startHelper(t, "hang")
	r := readReport(t, path)
	// What go test does when a test binary exceeds -timeout is harsher than this only in name.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The components die with their parent; the directory is swept by the next start.
	if err := sweepStale(filepath.Dir(r.Dir)); err != nil {
		t.Fatalf("sweeping stale control planes: %v", err)
	}
	assertGone(t, r)
}
