package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// webhookController is a lifeboat-controller serving the eviction webhook on a free loopback port,
// registered by URL, with its metrics on another.
type webhookController struct {
	*proc
	url, metrics string
}

func startControllerWithWebhook(t testing.TB) *webhookController {
	t.Helper()
	return startControllerWithWebhookAt(t, fmt.Sprintf("127.0.0.1:%d", freePort(t, "127.0.0.1")))
}

// startControllerWithWebhookAt is startControllerWithWebhook with the webhook at address (host:port).
func startControllerWithWebhookAt(t testing.TB, address string, args ...string) *webhookController {
	t.Helper()
	c := &webhookController{url: "https://" + address + webhook.Path}
	c.proc, c.metrics = startControllerWithMetrics(t, append([]string{
		"--webhook-listen", address, "--webhook-url", c.url, "--webhook-client-ca", cluster.CAFile()}, args...)...)
	t.Cleanup(func() {
		_ = cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), webhook.ConfigurationName, metav1.DeleteOptions{})
	})
	c.waitRegistered(t)
	return c
}

// waitRegistered waits until the webhook configuration points at this controller with a CA bundle.
func (c *webhookController) waitRegistered(t testing.TB) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cfg, err := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{})
		if err != nil || len(cfg.Webhooks) != 1 {
			return false, nil
		}
		cc := cfg.Webhooks[0].ClientConfig
		return cc.URL != nil && *cc.URL == c.url && len(cc.CABundle) > 0, nil
	})
	if err != nil {
		t.Fatalf("the controller did not register its webhook at %s within 30s", c.url)
	}
}

// evictPod posts an eviction of the pod; it returns the HTTP code (201 when granted) and the message.
func evictPod(t *testing.T, pod *corev1.Pod, dryRun bool) (int32, string) {
	t.Helper()
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}
	if dryRun {
		ev.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	}
	err := cluster.Kube.CoreV1().Pods(pod.Namespace).EvictV1(context.Background(), ev)
	if err == nil {
		return 201, ""
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("evicting %s: %v", pod.Name, err)
	}
	return status.Status().Code, status.Status().Message
}

func getVMI(t *testing.T, ns, name string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitBudget waits until the VMI has a budget the disruption controller has counted (want > 0), or none.
func waitBudget(t *testing.T, v *v1alpha1.VirtualMachineInstance, want int32) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := cluster.Kube.PolicyV1().PodDisruptionBudgets(v.Namespace).Get(ctx, disruption.BudgetName(v), metav1.GetOptions{})
		if want == 0 {
			last = fmt.Sprint(err)
			return apierrors.IsNotFound(err), nil
		}
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("minAvailable %s, status %+v", b.Spec.MinAvailable.String(), b.Status)
		return b.Spec.MinAvailable.IntValue() == int(want) && b.Status.ObservedGeneration == b.Generation && b.Status.CurrentHealthy >= 1, nil
	})
	if err != nil {
		t.Fatalf("VMI %s: want a counted budget keeping %d pods (0: none) within a minute; last: %s", v.Name, want, last)
	}
}

// TestAPIEvictionFinalAnswers walks seed 000's last table through the real API server, with the
// disruption controller of kube-controller-manager counting the budgets: first with the webhook
// down (the budgets alone answer), then with it up.
func TestAPIEvictionFinalAnswers(t *testing.T) {
	setConfig(t, false)
	ctrl := startControllerWithWebhook(t)
	startNodes(t, 1)
	// Somewhere a VM could go that nothing reaches: the migratable VMs are marked, and their
	// migrations wait, as the table has them (without it they could not leave: NoTargetNode).
	phantomNode(t, nil)
	ns := testNamespace(t)
	rows := []struct {
		name      string
		strategy  v1alpha1.EvictionStrategy
		disk      bool
		protected bool  // a budget
		code      int32 // the final answer with the webhook up
		marked    bool
	}{
		{"none", v1alpha1.EvictionStrategyNone, false, false, 201, false},
		{"live", v1alpha1.EvictionStrategyLiveMigrate, false, true, 429, true},
		{"live-disk", v1alpha1.EvictionStrategyLiveMigrate, true, true, 429, false},
		{"ifpossible", v1alpha1.EvictionStrategyLiveMigrateIfPossible, false, true, 429, true},
		{"ifpossible-disk", v1alpha1.EvictionStrategyLiveMigrateIfPossible, true, false, 201, false},
		{"external", v1alpha1.EvictionStrategyExternal, false, true, 429, true},
	}
	vmis := map[string]*v1alpha1.VirtualMachineInstance{}
	for _, r := range rows {
		mutate := []func(*v1alpha1.VirtualMachineInstance){strategy(r.strategy)}
		if r.disk {
			// A ReadWriteOnce claim: its own, which only one node can mount.
			createClaim(t, ns, r.name, corev1.ReadWriteOnce)
			mutate = append(mutate, withClaimDisk(r.name))
		}
		vmis[r.name] = createVMI(t, ns, newVMI(r.name, mutate...))
	}
	pods := map[string]*corev1.Pod{}
	for _, r := range rows {
		vmis[r.name] = waitVMI(t, ns, r.name, 2*bootTimeout, "Running with its LiveMigratable condition", func(v *v1alpha1.VirtualMachineInstance) bool {
			return running(v) && meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable) != nil
		})
		pods[r.name] = launcherPod(t, vmis[r.name])
		if _, ok := pods[r.name].Annotations[v1alpha1.AnnotationRequestEvictOnly]; !ok {
			t.Errorf("launcher pod %s lacks the descheduler's %s annotation", pods[r.name].Name, v1alpha1.AnnotationRequestEvictOnly)
		}
		want := int32(0)
		if r.protected {
			want = 1
		}
		waitBudget(t, vmis[r.name], want)
	}

	// The webhook down: failurePolicy Ignore lets every eviction through to the budgets.
	ctrl.stop()
	for _, r := range rows {
		if r.protected {
			code, msg := evictPod(t, pods[r.name], false)
			if code != 429 || !strings.Contains(msg, "disruption budget") {
				t.Errorf("%s, webhook down: got %d %q, want 429 from its disruption budget", r.name, code, msg)
			}
		} else if code, msg := evictPod(t, pods[r.name], true); code != 201 {
			t.Errorf("%s, webhook down: a dry-run eviction got %d %q, want it granted", r.name, code, msg)
		}
		if v := getVMI(t, ns, r.name); v.Status.EvacuationNodeName != "" {
			t.Errorf("%s: with the webhook down nothing marks the VM: %s", r.name, describe(v))
		}
	}

	// The webhook up again: a dry run decides without marking, once the API server calls it.
	ctrl.start(t)
	ctrl.waitRegistered(t)
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, msg = evictPod(t, pods["live"], true)
		return strings.Contains(msg, webhook.EvacuationText), nil
	})
	if err != nil {
		t.Fatalf("a dry-run eviction of the LiveMigrate VM's pod: %q, want the webhook's %q", msg, webhook.EvacuationText)
	}
	if v := getVMI(t, ns, "live"); v.Status.EvacuationNodeName != "" {
		t.Errorf("a dry-run eviction must not mark the VM: %s", describe(v))
	}

	// Only the API server makes the webhook act: a pod that reaches the webhook and posts a
	// made-up review, with no client certificate or with another one of the cluster CA's (an
	// admin's), is refused and marks nothing.
	admin, err := tls.X509KeyPair(cluster.Config.CertData, cluster.Config.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	for _, forger := range []struct {
		name string
		cert *tls.Certificate
	}{{"no client certificate", nil}, {"the cluster admin's certificate", &admin}} {
		code, body := forgeEvictionReview(t, ctrl.url, pods["live"], forger.cert)
		if code != http.StatusForbidden || !strings.Contains(body, "answers only the API server") {
			t.Errorf("a forged review with %s: %d %q, want 403 saying it answers only the API server", forger.name, code, body)
		}
		if v := getVMI(t, ns, "live"); v.Status.EvacuationNodeName != "" {
			t.Fatalf("a forged review with %s marked the VM: %s", forger.name, describe(v))
		}
	}
	if got := metricValue(t, ctrl.metrics, "lifeboat_eviction_webhook_unauthenticated_requests_total"); got != 2 {
		t.Errorf("unauthenticated requests = %v, want the 2 forged reviews", got)
	}
	// An ordinary pod's eviction never reaches the webhook.
	notAVM := `lifeboat_eviction_webhook_decisions_total{answer="allowed",strategy="NotAVM"}`
	before := metricValue(t, ctrl.metrics, notAVM)
	plain, err := cluster.Kube.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if code, msg := evictPod(t, plain, false); code != 201 {
		t.Errorf("evicting an ordinary pod: %d %q, want it granted", code, msg)
	}
	if after := metricValue(t, ctrl.metrics, notAVM); after != before {
		t.Errorf("an ordinary pod's eviction reached the webhook: %s went from %v to %v", notAVM, before, after)
	}

	for _, r := range rows {
		code, msg := evictPod(t, pods[r.name], false)
		v := getVMI(t, ns, r.name)
		t.Logf("%-16s %-22s eviction → %d %s; marked=%v", r.name, r.strategy, code, msg, v.MarkedForEvacuation())
		if code != r.code {
			t.Errorf("%s: eviction answered %d %q, want %d", r.name, code, msg, r.code)
		}
		if v.MarkedForEvacuation() != r.marked {
			t.Errorf("%s: marked=%v, want %v: %s", r.name, v.MarkedForEvacuation(), r.marked, describe(v))
		}
		if !r.marked {
			continue
		}
		want := fmt.Sprintf("%s %q", webhook.EvacuationText, ns+"/"+r.name)
		if !strings.Contains(msg, want) {
			t.Errorf("%s: the 429 %q must contain %q for the descheduler", r.name, msg, want)
		}
		if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); c == nil || c.Reason != string(v1alpha1.MigrationCauseAPIEviction) {
			t.Errorf("%s: want EvictionRequested with reason APIEviction: %+v", r.name, c)
		}
		waitEvent(t, ns, r.name, webhook.ReasonEvacuationRequested, 10*time.Second)
		if code, msg := evictPod(t, pods[r.name], false); code != 429 || !strings.Contains(msg, "Evacuation in progress") || !strings.Contains(msg, want) {
			t.Errorf("%s, evicted again: got %d %q, want 429 Evacuation in progress", r.name, code, msg)
		}
		waitPodAnnotation(t, pods[r.name], v1alpha1.AnnotationEvictionInProgress, true)
	}
	for _, r := range rows {
		if r.code == 201 {
			waitPodGone(t, pods[r.name], time.Minute)
		}
	}
	if got := metricValue(t, ctrl.metrics, `lifeboat_eviction_webhook_decisions_total{answer="evacuating",strategy="LiveMigrate"}`); got < 2 {
		t.Errorf("decisions evacuating/LiveMigrate = %v, want the dry run and the eviction", got)
	}
}

// waitPodAnnotation waits until the pod carries (or no longer carries) an annotation.
func waitPodAnnotation(t *testing.T, pod *corev1.Pod, key string, present bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		_, has := p.Annotations[key]
		return has == present, nil
	})
	if err != nil {
		t.Fatalf("pod %s: want annotation %s present=%v within 30s", pod.Name, key, present)
	}
}

func waitPodGone(t *testing.T, pod *corev1.Pod, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID), nil
	})
	if err != nil {
		t.Fatalf("pod %s was not evicted within %s", pod.Name, timeout)
	}
}

// TestKubectlDrain drains a node holding two LiveMigrate VMs and one None VM with kubectl: the
// drain completes, both LiveMigrate guests keep counting on the other node, the None VM's pod is evicted.
func TestKubectlDrain(t *testing.T) {
	setConfig(t, false)
	startControllerWithWebhook(t)
	nodes := startNodes(t, 2)
	source, other := nodes[0], nodes[1]
	setUnschedulable(t, other.Name(), true) // so every VM starts on the node to drain
	ns := testNamespace(t)
	names := []string{"drain-live-1", "drain-live-2", "drain-none"}
	for _, name := range names {
		s := v1alpha1.EvictionStrategyLiveMigrate
		if name == "drain-none" {
			s = v1alpha1.EvictionStrategyNone
		}
		createVMI(t, ns, newVMI(name, strategy(s)))
	}
	before := map[string]int{}
	var nonePod *corev1.Pod
	for _, name := range names {
		v := waitVMI(t, ns, name, 2*bootTimeout, "phase Running", running)
		if v.Status.NodeName != source.Name() {
			t.Fatalf("%s runs on %s, want %s", name, v.Status.NodeName, source.Name())
		}
		before[name] = waitCounterPast(t, source.consolePath(v), 0, bootTimeout)
		if name == "drain-none" {
			nonePod = launcherPod(t, v)
		}
	}
	setUnschedulable(t, other.Name(), false)
	// While the other node was cordoned no node could take the VMs (NoTargetNode); now one can.
	for _, name := range names[:2] {
		waitLiveMigratable(t, ns, name, metav1.ConditionTrue, "", 30*time.Second)
	}
	// What kubectl lifeboat status says before the drain is what the drain does (issue 46).
	waitConfigReady(t)
	predictDrain(t, ns, map[string]string{"drain-live-1": check.VerdictMigrates, "drain-live-2": check.VerdictMigrates, "drain-none": check.VerdictShutsDown})

	args := []string{"--kubeconfig", cluster.Kubeconfig, "drain", source.Name(), "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=5m"}
	start := time.Now()
	out, err := exec.Command(cluster.Binaries.Kubectl, args...).CombinedOutput()
	took := time.Since(start)
	t.Logf("kubectl %s: %s\n%s", strings.Join(args[2:], " "), took.Round(100*time.Millisecond), tail(string(out), 20))
	if err != nil {
		t.Fatalf("kubectl drain failed after %s: %v", took, err)
	}
	for _, name := range names[:2] {
		v := waitVMI(t, ns, name, 10*time.Second, "Running on "+other.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
			return running(v) && v.Status.NodeName == other.Name()
		})
		if v.MarkedForEvacuation() || v.Status.MigrationState == nil || v.Status.MigrationState.Cause != v1alpha1.MigrationCauseAPIEviction {
			t.Errorf("%s: want the mark cleared and a migration caused by the API eviction: %s, %+v", name, describe(v), v.Status.MigrationState)
		}
		waitCounterPast(t, other.consolePath(v), before[name]+2, 30*time.Second)
		waitBudget(t, v, 1)
	}
	waitPodGone(t, nonePod, 10*time.Second)
	if v := getVMI(t, ns, "drain-none"); !v.Status.Phase.Terminal() {
		t.Errorf("the None VM's pod was evicted: its VMI must have ended: %s", describe(v))
	}
}

func setUnschedulable(t *testing.T, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := cluster.Kube.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCancelAnEvacuation: an eviction marks a LiveMigrate VM whose migration cannot start (its only
// node is the one it leaves); the documented cancel (docs/operations.md) clears the mark, deletes
// the waiting migration, removes the descheduler's in-progress annotation, and says so in an Event.
func TestCancelAnEvacuation(t *testing.T) {
	setConfig(t, false)
	startControllerWithWebhook(t)
	n := startNodes(t, 1)[0]
	phantomNode(t, nil) // a node its migration may wait for (without one it would not be marked: NoTargetNode)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("cancelled", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	before := waitCounterPast(t, n.consolePath(vmi), 0, bootTimeout)
	pod := launcherPod(t, vmi)
	waitBudget(t, vmi, 1)

	var code int32
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, _ = evictPod(t, pod, false)
		return getVMI(t, ns, vmi.Name).MarkedForEvacuation(), nil
	})
	if err != nil || code != 429 {
		t.Fatalf("the eviction must mark the VM and answer 429: got %d, marked=%v", code, err == nil)
	}
	waitPodAnnotation(t, pod, v1alpha1.AnnotationEvictionInProgress, true)
	migrations := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := migrations.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 1, nil
	})
	if err != nil {
		t.Fatal("the mark did not lead to a migration within 30s")
	}

	// The documented cancel.
	out, err := exec.Command(cluster.Binaries.Kubectl, "--kubeconfig", cluster.Kubeconfig, "-n", ns,
		"annotate", "vmi", vmi.Name, v1alpha1.AnnotationCancelEvacuation+"=").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl annotate: %v\n%s", err, out)
	}
	v := waitVMI(t, ns, vmi.Name, 30*time.Second, "the mark cleared and the request removed", func(v *v1alpha1.VirtualMachineInstance) bool {
		_, requested := v.Annotations[v1alpha1.AnnotationCancelEvacuation]
		return !v.MarkedForEvacuation() && !requested
	})
	if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "EvacuationCancelled" {
		t.Errorf("want EvictionRequested=False, reason EvacuationCancelled: %+v", c)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := migrations.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Error("the waiting migration must be deleted")
	}
	waitPodAnnotation(t, pod, v1alpha1.AnnotationEvictionInProgress, false)
	waitEvent(t, ns, vmi.Name, "EvacuationCancelled", 10*time.Second)
	waitCounterPast(t, n.consolePath(vmi), before+2, 30*time.Second)
}

// TestACancelDoesNotOutliveTheNodesDeadline: when the kubelet is already stopping the VM's pod
// (node pressure), a cancel cannot keep the pod and would only lose the VM: it is refused, with a
// Warning Event saying why, the request is removed, and the mark stays.
func TestACancelDoesNotOutliveTheNodesDeadline(t *testing.T) {
	setConfig(t, true)
	n, vmi := runningVM(t, "cancel-too-late", strategy(v1alpha1.EvictionStrategyLiveMigrate))
	evict(t, n, vmi)
	ns := vmi.Namespace
	waitVMI(t, ns, vmi.Name, 30*time.Second, "marked with the kubelet's deadline", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.MarkedForEvacuation() && v.Status.EvacuationDeadline != nil
	})
	out, err := exec.Command(cluster.Binaries.Kubectl, "--kubeconfig", cluster.Kubeconfig, "-n", ns,
		"annotate", "vmi", vmi.Name, v1alpha1.AnnotationCancelEvacuation+"=").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl annotate: %v\n%s", err, out)
	}
	e := waitEvent(t, ns, vmi.Name, "EvacuationNotCancelled", 30*time.Second)
	if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "already being stopped (NodePressure)") {
		t.Errorf("Event %s %q: want a Warning saying the pod is already being stopped", e.Type, e.Message)
	}
	v := waitVMI(t, ns, vmi.Name, 30*time.Second, "the request removed", func(v *v1alpha1.VirtualMachineInstance) bool {
		_, requested := v.Annotations[v1alpha1.AnnotationCancelEvacuation]
		return !requested
	})
	if !v.MarkedForEvacuation() {
		t.Errorf("the refused cancel cleared the mark: %s", describe(v))
	}
}

// forgeEvictionReview posts, as any pod that can reach the webhook could, an AdmissionReview
// asking to evict pod, with cert as its client certificate (nil: none); it returns the HTTP
// status and body.
func forgeEvictionReview(t *testing.T, url string, pod *corev1.Pod, cert *tls.Certificate) (int, string) {
	t.Helper()
	code, body, err := postForgedReview(url, pod, cert)
	if err != nil {
		t.Fatalf("posting a forged review: %v", err)
	}
	return code, body
}

// postForgedReview is forgeEvictionReview, returning an error where the webhook does not answer.
func postForgedReview(url string, pod *corev1.Pod, cert *tls.Certificate) (int, string, error) {
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "forged", Kind: metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"},
			Resource:    metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			SubResource: "eviction", Name: pod.Name, Namespace: pod.Namespace, Operation: admissionv1.Create,
			UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:forger"},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		return 0, "", err
	}
	// The forger does not care who the server is.
	tlsConfig := &tls.Config{InsecureSkipVerify: true}
	if cert != nil {
		tlsConfig.Certificates = []tls.Certificate{*cert}
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), err
}
