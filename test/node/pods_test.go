package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

func TestScheduledPodRunsAndIsReady(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]

	pod := createPod(t, ns, shPod(node, "runs", "echo started; exec sleep 3600"))
	pod = waitForPod(t, ns, pod.Name, "Running and Ready", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && isReady(p)
	})

	if pod.Spec.NodeName != node.Name() {
		t.Errorf("the scheduler bound the pod to %q, want %q", pod.Spec.NodeName, node.Name())
	}
	if pod.Status.PodIP != node.Address() || pod.Status.HostIP != node.Address() {
		t.Errorf("podIP %q, hostIP %q: want the node's address %s", pod.Status.PodIP, pod.Status.HostIP, node.Address())
	}
	for _, typ := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodScheduled} {
		if c := condition(pod, typ); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("condition %s = %+v, want True", typ, c)
		}
	}
	cs := pod.Status.ContainerStatuses[0]
	if cs.State.Running == nil || cs.State.Running.StartedAt.IsZero() || !cs.Ready || !ptr.Deref(cs.Started, false) ||
		!strings.HasPrefix(cs.ContainerID, runtimeName+"://") {
		t.Errorf("container status %+v: want running since a time, started, ready, with an ID", cs)
	}
	if pod.Status.StartTime == nil {
		t.Error("the pod has no startTime")
	}
	waitForLog(t, node, pod, "main", "started\n")
}

func TestContainerExitCodes(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	for _, tc := range []struct {
		name       string
		script     string
		wantPhase  corev1.PodPhase
		wantCode   int32
		wantReason string
	}{
		{"exit 0 succeeds", "exit 0", corev1.PodSucceeded, 0, "Completed"},
		{"exit 3 fails", "exit 3", corev1.PodFailed, 3, "Error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := createPod(t, ns, shPod(node, "exit-"+strings.Fields(tc.script)[1], tc.script))
			pod = waitForPod(t, ns, pod.Name, string(tc.wantPhase), func(p *corev1.Pod) bool { return isTerminal(p.Status.Phase) })
			term := terminatedState(pod)
			if pod.Status.Phase != tc.wantPhase || term == nil || term.ExitCode != tc.wantCode || term.Reason != tc.wantReason || term.FinishedAt.IsZero() {
				t.Errorf("want phase %s with the container terminated %d %s; got\n%s", tc.wantPhase, tc.wantCode, tc.wantReason, statusYAML(pod))
			}
			if c := condition(pod, corev1.PodReady); c == nil || c.Status != corev1.ConditionFalse {
				t.Errorf("Ready = %+v, want False once the pod is done", c)
			}
		})
	}
}

func TestEnvironmentArgsAndWorkingDir(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	pod := shPod(node, "env", `echo "$POD_NAME $POD_NAMESPACE $POD_UID $NODE_NAME $POD_IP $HOST_IP $GREETING"; echo "$@"; pwd`)
	c := &pod.Spec.Containers[0]
	c.Command = append(c.Command, "argv0")
	c.Args = []string{"$(GREETING)", "$$(GREETING)"}
	c.WorkingDir = t.TempDir()
	c.Env = []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: field("metadata.name")},
		{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
		{Name: "POD_UID", ValueFrom: field("metadata.uid")},
		{Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
		{Name: "POD_IP", ValueFrom: field("status.podIP")},
		{Name: "HOST_IP", ValueFrom: field("status.hostIP")},
		{Name: "GREETING", Value: "hello-$(POD_NAME)"},
	}
	pod = createPod(t, ns, pod)
	pod = waitForPod(t, ns, pod.Name, "Succeeded", hasPhase(corev1.PodSucceeded))

	a := node.Address()
	want := strings.Join([]string{"env", ns, string(pod.UID), node.Name(), a, a, "hello-env"}, " ") + "\n" +
		"hello-env $(GREETING)\n" + c.WorkingDir + "\n"
	waitForLog(t, node, pod, "main", want)
}

func TestUnknownCommandFailsThePod(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	pod := shPod(node, "unknown", "")
	pod.Spec.Containers[0].Command = []string{"no-such-binary"}
	pod = createPod(t, ns, pod)
	pod = waitForPod(t, ns, pod.Name, "Failed", hasPhase(corev1.PodFailed))
	term := terminatedState(pod)
	if term == nil || term.Reason != reasonStartError || term.ExitCode != 128 || !strings.Contains(term.Message, `"no-such-binary"`) {
		t.Errorf("want the container terminated 128 StartError naming the command; got\n%s", statusYAML(pod))
	}
}

func TestInitContainersAreRejected(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	pod := shPod(node, "init", "exit 0")
	pod.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "emulated", Command: []string{"sh", "-c", "exit 0"}}}
	pod = createPod(t, ns, pod)
	pod = waitForPod(t, ns, pod.Name, "Failed", hasPhase(corev1.PodFailed))
	if pod.Status.Reason != reasonInitContainersUnsupported || !strings.HasPrefix(pod.Status.Message, "Pod was rejected: ") ||
		!strings.Contains(pod.Status.Message, "setup") {
		t.Errorf("want reason %s and a rejection message naming the init container; got\n%s", reasonInitContainersUnsupported, statusYAML(pod))
	}
}

func TestOnFailureRestartsUntilSuccess(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	// The emptyDir outlives the first run: the second one finds the mark and succeeds.
	work := filepath.Join(t.TempDir(), "work")
	pod := shPod(node, "retry", fmt.Sprintf(`if [ -e %[1]s/ran ]; then echo second; exit 0; fi; touch %[1]s/ran; exit 1`, work))
	pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: work}}
	pod = createPod(t, ns, pod)
	pod = waitForPod(t, ns, pod.Name, "Succeeded", hasPhase(corev1.PodSucceeded))

	cs := pod.Status.ContainerStatuses[0]
	last := cs.LastTerminationState.Terminated
	if cs.RestartCount != 1 || last == nil || last.ExitCode != 1 || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
		t.Errorf("want one restart after exit 1, then exit 0; got\n%s", statusYAML(pod))
	}
	waitForLog(t, node, pod, "main", "second\n")
}

func TestDeletionSendsSIGTERMAndRemovesThePod(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	dir := t.TempDir()
	pod := createPod(t, ns, shPod(node, "graceful",
		`trap 'echo TERM > `+dir+`/term; exit 0' TERM; touch `+dir+`/ready; while :; do sleep 0.1; done`))
	waitForFile(t, filepath.Join(dir, "ready"), "the container's SIGTERM trap set")
	waitForPod(t, ns, pod.Name, "Running", hasPhase(corev1.PodRunning))

	start := time.Now()
	if err := cluster.Kube.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}
	if got := waitForFile(t, filepath.Join(dir, "term"), "the trap to record SIGTERM"); got != "TERM\n" {
		t.Errorf("the trap wrote %q, want TERM", got)
	}
	waitForPodGone(t, ns, pod.Name)
	// The container ended on SIGTERM: its 30s grace period was not waited out.
	if elapsed := time.Since(start); elapsed > 15*time.Second {
		t.Errorf("the pod took %s to go", elapsed)
	}
}

// A pod being stopped keeps the Ready condition its readiness gate gave it when the stop began,
// as kubelet v1.37.1 does: it re-reads the gate only once the containers have ended.
func TestTerminatingPodReadsItsReadinessGateOnlyOnceStopped(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	dir := t.TempDir()
	const gate = corev1.PodConditionType("example.com/serving")
	pod := shPod(node, "gated", `trap 'touch `+dir+`/term' TERM; touch `+dir+`/ready; while [ ! -e `+dir+`/stop ]; do sleep 0.1; done`)
	pod.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: gate}}
	pod = createPod(t, ns, pod)
	waitForFile(t, filepath.Join(dir, "ready"), "the container's SIGTERM trap set")
	setGate := func(status corev1.ConditionStatus) {
		t.Helper()
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q}]}}`, gate, status)
		if _, err := cluster.Kube.CoreV1().Pods(ns).Patch(t.Context(), pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("setting the readiness gate %s: %v", status, err)
		}
	}
	setGate(corev1.ConditionTrue)
	waitForPod(t, ns, pod.Name, "Ready, its gate True", isReady)

	if err := cluster.Kube.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}
	waitForFile(t, filepath.Join(dir, "term"), "the container's SIGTERM: the node is stopping the pod")
	setGate(corev1.ConditionFalse)
	kubewait.Consistently(t, 3*time.Second, "the stopping pod Ready with its gate False", func(ctx context.Context) error {
		p, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := condition(p, gate); c == nil || c.Status != corev1.ConditionFalse {
			return fmt.Errorf("the gate is %+v, want False", c)
		}
		if !isReady(p) {
			return fmt.Errorf("the node followed the gate while its container runs:\n%s", statusYAML(p))
		}
		return nil
	})
	if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitForPodGone(t, ns, pod.Name)
}

func TestContainerIgnoringSIGTERMIsKilledAfterTheGracePeriod(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	node := startNodes(t, 1)[0]
	dir := t.TempDir()
	pod := shPod(node, "stubborn", `trap 'echo TERM >> `+dir+`/term' TERM; touch `+dir+`/ready; while :; do sleep 0.1; done`)
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	pod = createPod(t, ns, pod)
	waitForFile(t, filepath.Join(dir, "ready"), "the container's SIGTERM trap set")
	pod = waitForPod(t, ns, pod.Name, "Running", hasPhase(corev1.PodRunning))

	w, err := cluster.Kube.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		t.Fatalf("watching the pod: %v", err)
	}
	defer w.Stop()
	start := time.Now()
	if err := cluster.Kube.CoreV1().Pods(ns).Delete(t.Context(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}

	// The node writes the pod's final status, then deletes it.
	var final *corev1.Pod
	timeout := time.After(waitTimeout)
	for gone := false; !gone; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended before the pod was deleted")
			}
			gone = ev.Type == watch.Deleted
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Modified {
				final = p
			}
		case <-timeout:
			t.Fatalf("pod not deleted within %s; last seen:\n%s", waitTimeout, statusYAML(final))
		}
	}
	elapsed := time.Since(start)
	if elapsed < 2*time.Second || elapsed > 15*time.Second {
		t.Errorf("the pod went after %s, want the 2s grace period and a little", elapsed)
	}
	term := terminatedState(final)
	if final.Status.Phase != corev1.PodFailed || term == nil || term.ExitCode != 137 || term.Reason != "Error" {
		t.Errorf("want the final status Failed with the container SIGKILLed (137); got\n%s", statusYAML(final))
	}
	if got := waitForFile(t, filepath.Join(dir, "term"), "the trap to record SIGTERM"); got != "TERM\n" {
		t.Errorf("the trap wrote %q, want one TERM before the SIGKILL", got)
	}
}

func TestNodeRegistration(t *testing.T) {
	t.Parallel()
	node := startNodes(t, 1, func(c *Config) {
		c.Labels = map[string]string{"example.com/zone": "a"}
		c.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	})[0]
	n, err := cluster.Kube.CoreV1().Nodes().Get(t.Context(), node.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the node: %v", err)
	}
	for key, want := range map[string]string{
		KVMLabel: "true", corev1.LabelHostname: node.Name(), "example.com/zone": "a", corev1.LabelOSStable: "linux",
	} {
		if got := n.Labels[key]; got != want {
			t.Errorf("label %s = %q, want %q", key, got, want)
		}
	}
	wantAddresses := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: node.Address()}, {Type: corev1.NodeHostName, Address: node.Name()}}
	if len(n.Status.Addresses) != 2 || n.Status.Addresses[0] != wantAddresses[0] || n.Status.Addresses[1] != wantAddresses[1] {
		t.Errorf("addresses %v, want %v", n.Status.Addresses, wantAddresses)
	}
	for name, want := range map[corev1.ResourceName]string{corev1.ResourceCPU: "2", corev1.ResourceMemory: "8Gi", corev1.ResourcePods: "110"} {
		if got := n.Status.Allocatable[name]; got.String() != want {
			t.Errorf("allocatable %s = %s, want %s", name, got.String(), want)
		}
	}
	if n.Status.NodeInfo.KubeletVersion != "v1.37.1" {
		t.Errorf("kubelet version %q, want v1.37.1", n.Status.NodeInfo.KubeletVersion)
	}
	waitForLease(t, node)
}

// TestRestartedNodeDoesNotRerunPods: a node that comes back under the same name finds its
// pods' containers gone, as a kubelet does after a reboot, and a pod with restartPolicy Never
// fails rather than run twice.
func TestRestartedNodeDoesNotRerunPods(t *testing.T) {
	t.Parallel()
	ns := testNamespace(t)
	// Outside StartN's names and addresses, so that the test can start the same node twice.
	cfg := Config{Client: cluster.Kube, Name: "node-restarted", Address: "127.0.0.10", RootDir: t.TempDir(), Binaries: testBinaries}
	first, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	t.Cleanup(func() {
		first.Stop()
		_ = cluster.Kube.CoreV1().Nodes().Delete(context.Background(), cfg.Name, metav1.DeleteOptions{})
	})
	runs := filepath.Join(t.TempDir(), "runs")
	pod := createPod(t, ns, shPod(first, "once", "echo run >> "+runs+"; exec sleep 3600"))
	waitForPod(t, ns, pod.Name, "Running", hasPhase(corev1.PodRunning))
	first.Stop()

	second, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("starting the node again: %v", err)
	}
	t.Cleanup(second.Stop)
	pod = waitForPod(t, ns, pod.Name, "Failed", hasPhase(corev1.PodFailed))
	cs := pod.Status.ContainerStatuses[0]
	if term := cs.State.Terminated; term == nil || term.ExitCode != 137 || term.Reason != reasonContainerStatusUnknown || cs.RestartCount != 1 {
		t.Errorf("want the container lost with the node (137 %s, counted as a restart); got\n%s", reasonContainerStatusUnknown, statusYAML(pod))
	}
	if got := waitForFile(t, runs, "the container's run recorded"); got != "run\n" {
		t.Errorf("the container ran %d times, want once", strings.Count(got, "run"))
	}
}
