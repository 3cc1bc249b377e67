package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// checkReport is `kubectl lifeboat check -o json` as a script reads it.
type checkReport struct {
	Results []check.Result `json:"results"`
	Failed  bool           `json:"failed"`
}

// line is the result of the named check, failing the test if there is none.
func (r checkReport) line(t *testing.T, name string) check.Result {
	t.Helper()
	for _, res := range r.Results {
		if res.Check == name {
			return res
		}
	}
	t.Fatalf("no check %q in the report: %+v", name, r.Results)
	return check.Result{}
}

// runCheckJSON runs `kubectl lifeboat check -o json ARGS` and returns its report and exit status.
func runCheckJSON(t *testing.T, args ...string) (checkReport, int) {
	t.Helper()
	cmd := kubectlLifeboatCommand(append([]string{"check", "-o", "json"}, args...)...)
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("kubectl lifeboat check: %v", err)
	}
	var rep checkReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("kubectl lifeboat check -o json (exit %d): %v\n%s", code, err, out)
	}
	return rep, code
}

// waitCheck runs the check until the named line has the status and says says, and returns that
// report and the exit status.
func waitCheck(t *testing.T, timeout time.Duration, name string, status check.Status, says string, args ...string) (checkReport, int) {
	t.Helper()
	var rep checkReport
	var code int
	var last check.Result
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(context.Context) (bool, error) {
		rep, code = runCheckJSON(t, args...)
		for _, res := range rep.Results {
			if res.Check == name {
				last = res
				return res.Status == status && strings.Contains(res.Message, says), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("check %q: want %s saying %q within %s; last %+v", name, status, says, timeout, last)
	}
	return rep, code
}

func wantLine(t *testing.T, r check.Result, status check.Status, says ...string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("check %q: %s (%s), want %s", r.Check, r.Status, r.Message, status)
	}
	for _, s := range says {
		if !strings.Contains(r.Message, s) {
			t.Errorf("check %q says %q, want it to say %q", r.Check, r.Message, s)
		}
	}
}

// poolLabel is a label of the test's nodes that its VM selects.
const poolLabel = "e2e-check/pool"

// TestCheck: `kubectl lifeboat check` on a healthy cluster says so and exits 0; then, as a VM is
// pinned to its node, a migration of it cannot find a target, the agent of its node stops and
// the controller stops, each failure gets its line and the exit status is 1.
func TestCheck(t *testing.T) {
	setConfig(t, true)
	hookPort := freePort(t, "127.0.0.1")
	hook := &webhookController{url: fmt.Sprintf("https://127.0.0.1:%d%s", hookPort, webhook.Path)}
	hook.proc = startController(t, "--leader-elect",
		"--webhook-listen", fmt.Sprintf("127.0.0.1:%d", hookPort), "--webhook-url", hook.url, "--webhook-client-ca", cluster.CAFile())
	t.Cleanup(func() {
		_ = cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), webhook.ConfigurationName, metav1.DeleteOptions{})
	})
	hook.waitRegistered(t)
	nodes := startNodes(t, 2, func(c *node.Config) {
		c.Binaries["sleep"] = "/bin/sleep"
		c.Labels = map[string]string{poolLabel: "blue"}
	})
	agents := standInAgents(t)
	ns := restrictedNamespace(t)
	vmi, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(context.Background(),
		newVMI("web", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.NodeSelector = map[string]string{poolLabel: "blue"}
		}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	home := nodeOf(t, nodes, vmi)
	var other *testNode
	for _, n := range nodes {
		if n != home {
			other = n
		}
	}

	// Healthy: the check waits for the agents' stand-ins to be ready.
	rep, code := waitCheck(t, time.Minute, "agents", check.OK, "ready on all 2 VM node(s)", "-n", ns)
	if code != 0 || rep.Failed {
		t.Errorf("a healthy cluster: exit %d, failed %v; want 0, false: %+v", code, rep.Failed, rep.Results)
	}
	for _, crd := range check.CRDs {
		wantLine(t, rep.line(t, "CRD "+crd.Name), check.OK, "v1alpha1 served, its schema as this kubectl-lifeboat expects")
	}
	wantLine(t, rep.line(t, "LifeboatConfig"), check.OK, "feature gates [NodePressureEvictionLiveMigration]")
	wantLine(t, rep.line(t, "controller"), check.OK, "leads (Lease lifeboat-system/lifeboat-controller renewed", "no Deployment lifeboat-system/lifeboat-controller: it runs outside the cluster")
	wantLine(t, rep.line(t, "eviction webhook"), check.OK, "registered at "+hook.url)
	// The API server here presents its client certificate, but no eviction has reached the webhook
	// yet: a controller that records the webhook's mode says it does not authenticate so far, one
	// that does not leaves it unknown.
	if auth := rep.line(t, "webhook authentication"); auth.Status == check.Unknown {
		wantLine(t, auth, check.Unknown, "not recorded")
	} else {
		wantLine(t, auth, check.Warn, "the API server has not authenticated to it (NoAuthenticatedCallSeen)")
	}
	// The API server proxies nodes/proxy (the check's /configz) to no loopback address, where the
	// emulated nodes serve their kubelet API (which has no /configz either).
	wantLine(t, rep.line(t, "node "+home.Name()+" eviction"), check.Unknown, "not served through the API server (HTTP 400: address not allowed)")
	wantLine(t, rep.line(t, "VM namespaces' Pod Security"), check.OK, "all 1 VM namespace(s) enforce restricted")
	wantLine(t, rep.line(t, "VMs"), check.OK, "all 1 running VM(s) can live-migrate")
	wantLine(t, rep.line(t, "migrations"), check.OK, "0 in flight")
	text, err := kubectlLifeboat(t, "check", "-n", ns)
	if err != nil || !strings.Contains(text, "\nok      controller: ") || !strings.Contains(text, " 0 fail, ") {
		t.Errorf("kubectl lifeboat check: %v; want exit 0, the line \"ok      controller: …\" and \"0 fail\" in the summary", err)
	}

	// Pinned: the other node leaves the VM's pool, so no other node matches its nodeSelector.
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, poolLabel)
	if _, err := cluster.Kube.CoreV1().Nodes().Patch(context.Background(), other.Name(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	vmLine := "VM " + ns + "/web"
	// Said the check's way ("pinned: …") until the controller writes NoTargetNode, then the condition's.
	rep, code = waitCheck(t, time.Minute, vmLine, check.Fail, "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector "+poolLabel+"=blue", "-n", ns)
	wantLine(t, rep.line(t, vmLine), check.Fail, "on node "+home.Name()+" cannot live-migrate", "eviction strategy LiveMigrate: a drain of its node waits for ever")
	if code != 1 || !rep.Failed {
		t.Errorf("a pinned VM: exit %d, failed %v; want 1, true", code, rep.Failed)
	}
	if _, err := kubectlLifeboat(t, "check", "-n", ns); err == nil {
		t.Error("kubectl lifeboat check exits 0 with a failed check")
	}

	// Stuck: a migration of the pinned VM waits for a target node that never comes. A VM no node
	// can take gets no migration that waits (NoTargetNode fails it at once): a phantom node in
	// the pool, which nothing reaches, makes it one that waits.
	phantom := phantomNode(t, map[string]string{poolLabel: "blue"})
	waitLiveMigratable(t, ns, vmi.Name, metav1.ConditionTrue, "", 30*time.Second)
	m, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Create(context.Background(), &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "web-stuck"}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Delete(context.Background(), m.Name, metav1.DeleteOptions{})
	})
	waitCheck(t, time.Minute, "migration "+ns+"/"+m.Name, check.Fail, "of VMI web still ", "-n", ns, "--stuck-after", "5s")
	if err := cluster.Kube.CoreV1().Nodes().Delete(context.Background(), phantom, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The agent of the VM's node stops, and its DaemonSet pod there goes.
	home.agent.stop()
	agents.exclude(t, home.Name())
	waitCheck(t, time.Minute, "agent on node "+home.Name(), check.Fail, "no ready agent, yet 1 VM(s) run there ("+ns+"/web)", "-n", ns)

	// The controller stops: its Lease is released and no replica leads.
	hook.stop()
	rep, code = waitCheck(t, time.Minute, "controller", check.Fail, "not installed: no Deployment lifeboat-system/lifeboat-controller and no replica leads", "-n", ns)
	if code != 1 {
		t.Errorf("with the controller stopped: exit %d, want 1", code)
	}
}

// standInAgents runs a DaemonSet lifeboat-system/lifeboat-agent on the VM nodes, which is what the
// check reads of agents. The emulated nodes run the real agents as the test's processes
// (startNodes), and cannot run the agent's image; the DaemonSet's pods stand for them, each ready
// while the emulated node runs it, as the kubelet would report an agent's pod.
type standIn struct{ ds *appsv1.DaemonSet }

func standInAgents(t *testing.T) *standIn {
	t.Helper()
	labels := map[string]string{"app.kubernetes.io/name": check.AgentName}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: check.AgentName, Namespace: controlplane.LifeboatNamespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{v1alpha1.LabelKVMNode: "true"},
					TerminationGracePeriodSeconds: new(int64),
					Containers:                    []corev1.Container{{Name: "agent", Image: "lifeboat.dev/lifeboat-agent:dev", Command: []string{"sleep", "infinity"}}},
				},
			},
		},
	}
	ds, err := cluster.Kube.AppsV1().DaemonSets(ds.Namespace).Create(context.Background(), ds, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.AppsV1().DaemonSets(ds.Namespace).Delete(context.Background(), ds.Name, metav1.DeleteOptions{})
	})
	return &standIn{ds: ds}
}

// exclude keeps the DaemonSet off the node: its pod there is deleted.
func (s *standIn) exclude(t *testing.T, nodeName string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"NotIn","values":[%q]}]}]}}}}}}}`, nodeName)
	if _, err := cluster.Kube.AppsV1().DaemonSets(s.ds.Namespace).Patch(context.Background(), s.ds.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckInstallationFailures: a webhook registered for a Service with no ready endpoint, and a
// CRD older than the plugin (its schema without a field of the types), each fail their line.
func TestCheckInstallationFailures(t *testing.T) {
	ctx := context.Background()
	// The controller registers the webhook for the Service of the manifests, which selects the
	// Deployment's pods: there are none here.
	startController(t, "--webhook-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t, "127.0.0.1")), "--webhook-client-ca", cluster.CAFile())
	t.Cleanup(func() {
		_ = cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), webhook.ConfigurationName, metav1.DeleteOptions{})
	})
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lifeboat-webhook", Namespace: controlplane.LifeboatNamespace},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": check.ControllerName},
			Ports: []corev1.ServicePort{{Name: "webhook", Port: webhook.ServicePort, TargetPort: intstr.FromInt32(8443)}}},
	}
	if _, err := cluster.Kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.CoreV1().Services(svc.Namespace).Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	rep, code := waitCheck(t, time.Minute, "eviction webhook", check.Fail, "its Service lifeboat-system/lifeboat-webhook has no ready endpoint: the API server cannot reach it")
	if code != 1 || !rep.Failed {
		t.Errorf("a webhook without endpoints: exit %d, failed %v; want 1, true", code, rep.Failed)
	}

	// The LifeboatConfig's CRD as an older release had it: without spec.nodePressureRelief.
	crds := apiextensions.NewForConfigOrDie(cluster.Config).ApiextensionsV1().CustomResourceDefinitions()
	name := "lifeboatconfigs." + v1alpha1.GroupName
	original, err := crds.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	older := original.DeepCopy()
	delete(older.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties, "nodePressureRelief")
	if _, err := crds.Update(ctx, older, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			current, err := crds.Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			current.Spec = original.Spec
			_, err = crds.Update(context.Background(), current, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Errorf("restoring CRD %s: %v", name, err)
			return
		}
		// The next test's LifeboatConfig must keep the field: wait until the API server serves
		// the restored schema, which a dry-run create shows by keeping it.
		probe := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName},
			Spec: v1alpha1.LifeboatConfigSpec{NodePressureRelief: &v1alpha1.NodePressureReliefConfig{Enabled: ptr.To(true)}}}
		err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return apierrors.IsAlreadyExists(err) || (err == nil && got.Spec.NodePressureRelief != nil), nil
		})
		if err != nil {
			t.Errorf("CRD %s: the restored schema was not served within 30s", name)
		}
	})
	rep, code = waitCheck(t, time.Minute, "CRD "+name, check.Fail, "older than this kubectl-lifeboat: the served v1alpha1 schema lacks spec.nodePressureRelief")
	if code != 1 || !rep.Failed {
		t.Errorf("an older CRD: exit %d, failed %v; want 1, true", code, rep.Failed)
	}
}
