package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// forgedAnswer posts a forged review of pod without a client certificate and decodes the
// webhook's answer, which must be one it read (HTTP 200).
func forgedAnswer(t *testing.T, url string, pod *corev1.Pod) *admissionv1.AdmissionResponse {
	t.Helper()
	code, body := forgeEvictionReview(t, url, pod, nil)
	var review admissionv1.AdmissionReview
	if code != http.StatusOK || json.Unmarshal([]byte(body), &review) != nil || review.Response == nil {
		t.Fatalf("want an AdmissionReview with a response (HTTP 200), got %d %q", code, body)
	}
	return review.Response
}

func answerMessage(r *admissionv1.AdmissionResponse) string {
	if r.Result == nil {
		return ""
	}
	return r.Result.Message
}

// waitModeCondition waits until the LifeboatConfig's EvictionWebhookStrict condition has status and reason.
func waitModeCondition(t *testing.T, status metav1.ConditionStatus, reason string) *v1alpha1.LifeboatConfig {
	t.Helper()
	return kubewait.For(t, 30*time.Second, fmt.Sprintf("the LifeboatConfig's %s=%s (%s)", v1alpha1.ConfigConditionEvictionWebhookStrict, status, reason), getConfig, func(c *v1alpha1.LifeboatConfig) bool {
		cond := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConfigConditionEvictionWebhookStrict)
		return cond != nil && cond.Status == status && cond.Reason == reason
	}, showConfigStatus)
}

func getConfig(ctx context.Context) (*v1alpha1.LifeboatConfig, error) {
	return cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
}

func showConfigStatus(c *v1alpha1.LifeboatConfig) string { return fmt.Sprintf("%+v", c.Status) }

// waitLog waits until the process's log has a line with every one of parts.
func waitLog(t *testing.T, p *proc, parts ...string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(p.LogPath())
		if err != nil {
			return false, nil
		}
		for _, line := range strings.Split(string(b), "\n") {
			all := true
			for _, part := range parts {
				all = all && strings.Contains(line, part)
			}
			if all {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the %s log has no line with %q within 30s:\n%s", p.name, parts, tail(p.LogTail(), 20))
	}
}

// vmiMigrations lists the VMI's migrations.
func vmiMigrations(t *testing.T, v *v1alpha1.VirtualMachineInstance) []v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// TestAWebhookTheAPIServerCannotAuthenticate: where the API server presents no client certificate
// (the webhook served at cluster.WebhookAddressWithoutClientCert, as on a kubeadm, k3s or managed
// cluster), the webhook says it is permissive and still acts. A forged review, posted straight to
// it without a certificate, moves a LiveMigrate VM once, with no deadline, no pause and no
// shutdown, and not again within the interval; it never marks an External VM. kubectl drain
// (the API server's own evictions, unauthenticated too) moves the VM again, since a drain
// cordons the node, and completes.
func TestAWebhookTheAPIServerCannotAuthenticate(t *testing.T) {
	setConfig(t, false)
	ctrl := startControllerWithWebhookAt(t, cluster.WebhookAddressWithoutClientCert)
	waitLog(t, ctrl.proc, "eviction webhook mode", `"mode":"permissive"`, webhook.ReasonNoAuthenticatedCallSeen)
	waitModeCondition(t, metav1.ConditionFalse, webhook.ReasonNoAuthenticatedCallSeen)
	if got := metricValue(t, ctrl.metrics, `lifeboat_eviction_webhook_mode{mode="permissive"}`); got != 1 {
		t.Errorf(`lifeboat_eviction_webhook_mode{mode="permissive"} = %v, want 1`, got)
	}
	nodes := startNodes(t, 2)
	ns := testNamespace(t)
	live := createVMI(t, ns, newVMI("forged-live", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	external := createVMI(t, ns, newVMI("forged-external", strategy(v1alpha1.EvictionStrategyExternal)))
	live = waitVMI(t, ns, live.Name, 2*bootTimeout, "phase Running", running)
	external = waitVMI(t, ns, external.Name, 2*bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, live)
	before := waitCounterPast(t, source.consolePath(live), 0, bootTimeout)
	waitVMI(t, ns, live.Name, 30*time.Second, "LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		ok, _ := v.LiveMigratable()
		return ok
	})

	// A forged review without a certificate: the VM is marked, with no deadline, and migrates.
	pod := launcherPod(t, live)
	answer := forgedAnswer(t, ctrl.url, pod)
	if answer.Allowed || !strings.Contains(answerMessage(answer), webhook.EvacuationText) {
		t.Fatalf("a forged review of a LiveMigrate VM's pod in permissive mode: %+v, want 429 %q", answer, webhook.EvacuationText)
	}
	if v := getVMI(t, ns, live.Name); !v.MarkedForEvacuation() || v.Status.EvacuationDeadline != nil {
		t.Errorf("want the VM marked without a deadline: %s, deadline %v", describe(v), v.Status.EvacuationDeadline)
	}
	moved := waitVMI(t, ns, live.Name, 3*time.Minute, "Running on another node, the mark cleared", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName != source.Name() && !v.MarkedForEvacuation()
	})
	target := nodeOf(t, nodes, moved)
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)
	migrations := vmiMigrations(t, live)
	if len(migrations) != 1 {
		t.Fatalf("want one migration of the VM, got %d", len(migrations))
	}
	m := migrations[0]
	if _, ok := m.Annotations[v1alpha1.AnnotationDeadline]; ok || m.Status.Mode == v1alpha1.MigrationModePaused || m.Status.Mode == v1alpha1.MigrationModePostCopy {
		t.Errorf("a forged review's migration must have no deadline and never pause the guest: annotations %v, mode %s", m.Annotations, m.Status.Mode)
	}
	if m.Status.Phase != v1alpha1.MigrationSucceeded {
		t.Errorf("migration %s: phase %s, want %s", m.Name, m.Status.Phase, v1alpha1.MigrationSucceeded)
	}

	// Again, at once, of its new launcher pod: bounded, nothing marked.
	answer = forgedAnswer(t, ctrl.url, launcherPodOn(t, moved, moved.Status.NodeName))
	if answer.Allowed || !strings.Contains(answerMessage(answer), "at most once every 1h0m0s") {
		t.Errorf("a second forged review within the interval: %+v, want 429 saying a VM moves at most once every 1h0m0s", answer)
	}
	// An External VM: its mark would ask an outside controller to stop it.
	answer = forgedAnswer(t, ctrl.url, launcherPod(t, external))
	if answer.Allowed || !strings.Contains(answerMessage(answer), "only for the API server") {
		t.Errorf("a forged review of an External VM's pod: %+v, want 429 saying it is marked only for the API server", answer)
	}
	for _, name := range []string{live.Name, external.Name} {
		if v := getVMI(t, ns, name); v.MarkedForEvacuation() || !running(v) {
			t.Errorf("%s: a bounded review must change nothing: %s", name, describe(v))
		}
	}
	if n := len(vmiMigrations(t, live)); n != 1 {
		t.Errorf("want still one migration of the VM, got %d", n)
	}
	for sample, want := range map[string]float64{
		`lifeboat_eviction_webhook_unauthenticated_reviews_total{answer="evacuating"}`: 1,
		`lifeboat_eviction_webhook_unauthenticated_reviews_total{answer="bounded"}`:    2,
		`lifeboat_eviction_webhook_unauthenticated_requests_total`:                     0,
	} {
		if got := metricValue(t, ctrl.metrics, sample); got != want {
			t.Errorf("%s = %v, want %v", sample, got, want)
		}
	}

	// A drain: the API server presents no certificate, the node is cordoned, the VM moves again
	// within the interval, and the drain completes. The External VM would hold any drain until
	// its outside controller acts, so it goes first.
	if err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Delete(t.Context(), external.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitVMIGone(t, ns, external.Name)
	before = waitCounterPast(t, target.consolePath(moved), 0, 10*time.Second)
	args := []string{"--kubeconfig", cluster.Kubeconfig, "drain", target.Name(), "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m"}
	start := time.Now()
	out, err := exec.Command(cluster.Binaries.Kubectl, args...).CombinedOutput()
	t.Logf("kubectl %s: %s\n%s", strings.Join(args[2:], " "), time.Since(start).Round(100*time.Millisecond), tail(string(out), 20))
	if err != nil {
		t.Fatalf("kubectl drain failed where the API server presents no client certificate: %v", err)
	}
	v := waitVMI(t, ns, live.Name, 10*time.Second, "Running on "+source.Name(), func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName == source.Name()
	})
	waitCounterPast(t, source.consolePath(v), before+2, 30*time.Second)
	if v.Status.MigrationState == nil || v.Status.MigrationState.Cause != v1alpha1.MigrationCauseAPIEviction {
		t.Errorf("want the drain's migration caused by the API eviction: %+v", v.Status.MigrationState)
	}
	// The API server's own calls were unauthenticated: the webhook stayed permissive.
	if got := metricValue(t, ctrl.metrics, `lifeboat_eviction_webhook_unauthenticated_reviews_total{answer="evacuating"}`); got < 2 {
		t.Errorf("unauthenticated reviews that marked the VM = %v, want the forged one and the drain's", got)
	}
	if got := metricValue(t, ctrl.metrics, `lifeboat_eviction_webhook_mode{mode="permissive"}`); got != 1 {
		t.Errorf(`after the drain, lifeboat_eviction_webhook_mode{mode="permissive"} = %v, want 1`, got)
	}
}

func waitVMIGone(t *testing.T, ns, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("VMI %s/%s still there after 2 minutes", ns, name)
	}
}

// TestTheWebhookStaysStrictOnceTheAPIServerAuthenticated: the webhook reads a review without a
// certificate while the API server has never presented one; once the API server has (a dry-run
// eviction through it), the LifeboatConfig records it, and the webhook refuses every review
// without the certificate (403), before reading it, also after the controller restarts.
func TestTheWebhookStaysStrictOnceTheAPIServerAuthenticated(t *testing.T) {
	setConfig(t, false)
	ctrl := startControllerWithWebhook(t)
	waitModeCondition(t, metav1.ConditionFalse, webhook.ReasonNoAuthenticatedCallSeen)
	ns := testNamespace(t)
	// No node: its launcher pod stays Pending and the VM cannot migrate, so answers change nothing.
	vmi := createVMI(t, ns, newVMI("ratchet", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(vmi.UID)})
		if err != nil || len(pods.Items) != 1 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatal("no launcher pod within 30s")
	}
	// The webhook's cache knows the VMI before it decides on it.
	decided := func(answer *admissionv1.AdmissionResponse) bool {
		return !answer.Allowed && strings.Contains(answerMessage(answer), "cannot be live-migrated")
	}
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return decided(forgedAnswer(t, ctrl.url, pod)), nil
	})
	if err != nil {
		t.Fatal("permissive, the webhook must read a review without a certificate and answer it (429: the VM cannot be live-migrated)")
	}

	// The API server calls, with its certificate.
	if code, msg := evictPod(t, pod, true); code != 429 || !strings.Contains(msg, "cannot be live-migrated") {
		t.Fatalf("a dry-run eviction through the API server: %d %q, want the webhook's 429", code, msg)
	}
	config := waitModeCondition(t, metav1.ConditionTrue, webhook.ReasonAuthenticatedCallSeen)
	if config.Status.EvictionWebhook == nil || config.Status.EvictionWebhook.AuthenticatedCallSeen == nil {
		t.Fatalf("want status.evictionWebhook.authenticatedCallSeen recorded: %+v", config.Status)
	}
	waitEvent(t, "default", v1alpha1.ConfigName, webhook.ReasonEvictionWebhookStrict, 10*time.Second)
	if got := metricValue(t, ctrl.metrics, `lifeboat_eviction_webhook_mode{mode="strict"}`); got != 1 {
		t.Errorf(`lifeboat_eviction_webhook_mode{mode="strict"} = %v, want 1`, got)
	}
	if code, body := forgeEvictionReview(t, ctrl.url, pod, nil); code != http.StatusForbidden {
		t.Errorf("a review without a certificate after the API server authenticated: %d %q, want 403", code, body)
	}
	waitLog(t, ctrl.proc, "the first this replica refused", "fix")

	// The record cannot be taken back, even by a cluster admin's write of the status.
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := configs.Get(t.Context(), v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.EvictionWebhook = nil
		_, err = configs.UpdateStatus(t.Context(), c, metav1.UpdateOptions{})
		return err
	})
	if !apierrors.IsInvalid(err) {
		t.Errorf("clearing the record: %v, want it refused as invalid", err)
	}

	// After a restart the record holds: strict from the first request.
	ctrl.stop()
	ctrl.start(t)
	var code int
	var body string
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c, b, err := postForgedReview(ctrl.url, pod, nil)
		code, body = c, b
		return err == nil, nil
	})
	if err != nil {
		t.Fatal("the restarted webhook did not answer within 30s")
	}
	if code != http.StatusForbidden {
		t.Errorf("a review without a certificate after a restart: %d %q, want 403", code, body)
	}
	waitLog(t, ctrl.proc, "eviction webhook mode", `"mode":"strict"`, webhook.ReasonAuthenticatedCallSeen)
	if v := getVMI(t, ns, vmi.Name); v.MarkedForEvacuation() {
		t.Errorf("nothing may mark the VM: %s", describe(v))
	}
}
