package integration

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// startWebhook serves the eviction webhook in this process on a free loopback port, registered by
// URL with the real API server, strict (the API server presents its client certificate), and
// waits until it is registered.
func startWebhook(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	pem, err := os.ReadFile(cluster.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the cluster CA file")
	}
	kubeInformers := informers.NewSharedInformerFactoryWithOptions(cluster.Kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = v1alpha1.LabelRole + "=" + v1alpha1.RoleLauncher
	}))
	nodeInformers := informers.NewSharedInformerFactory(cluster.Kube, 0)
	lbInformers := lifeboatinformers.NewSharedInformerFactory(cluster.Lifeboat, 0)
	lbv1 := lbInformers.Lifeboat().V1alpha1()
	url := "https://" + addr + webhook.Path
	hook, err := webhook.New(cluster.Kube, cluster.Lifeboat, kubeInformers.Core().V1().Pods(), lbv1.VirtualMachineInstances(), lbv1.LifeboatConfigs(),
		nodeInformers.Core().V1().Nodes().Informer(), record.NewFakeRecorder(100),
		webhook.Options{Listen: addr, Endpoint: webhook.Endpoint{URL: url}, CertValidity: time.Hour,
			ClientCAs: roots, ClientNames: []string{controlplane.WebhookClientName}, ClientAuth: webhook.ClientAuthStrict},
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	kubeInformers.Start(ctx.Done())
	nodeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())
	go func() { _ = hook.Run(ctx) }()
	t.Cleanup(func() {
		_ = cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), webhook.ConfigurationName, metav1.DeleteOptions{})
	})
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{})
		return err == nil && len(c.Webhooks) == 1 && c.Webhooks[0].ClientConfig.URL != nil && *c.Webhooks[0].ClientConfig.URL == url, nil
	})
	if err != nil {
		t.Fatal("the webhook did not register within 30s")
	}
}

// evict posts an eviction of ns/name (a dry run if asked); it returns 201 when granted, or the
// refusal's code and message.
func evict(t *testing.T, ns, name string, dryRun bool) (int32, string) {
	t.Helper()
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if dryRun {
		ev.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	}
	err := cluster.Kube.CoreV1().Pods(ns).EvictV1(context.Background(), ev)
	if err == nil {
		return 201, ""
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("evicting %s: %v", name, err)
	}
	return status.Status().Code, status.Status().Message
}

// TestEvictionsOfVMsNoNodeCanTake is issue 44 item 4 through the real API server and the webhook,
// without guests: three VMs pinned by nodeSelector to a node no other VM node matches, and one VM
// free to go. The LiveMigrate VM's eviction gets 429 naming why at once and is not marked; the
// LiveMigrateIfPossible VM's eviction goes through (seed 000: it behaves as None); the External VM
// is marked as always; the free VM is marked for a migration. The webhook decides on the nodes as
// its cache shows them: no controller has written NoTargetNode on these VMIs.
func TestEvictionsOfVMsNoNodeCanTake(t *testing.T) {
	ctx := context.Background()
	startWebhook(t)
	ns := cluster.Namespace(t, "pinned-")
	const pin = "integration.lifeboat.dev/pinned"
	source := "pinned-source-" + ns
	for name, labels := range map[string]map[string]string{
		source:               {v1alpha1.LabelKVMNode: "true", pin: "yes"},
		"pinned-other-" + ns: {v1alpha1.LabelKVMNode: "true"},
	} {
		if _, err := cluster.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	vm := func(name string, s v1alpha1.EvictionStrategy, pinned bool) string {
		v := exampleVMI(name)
		v.Spec.EvictionStrategy = ptr.To(s)
		if pinned {
			v.Spec.NodeSelector = map[string]string{pin: "yes"}
		}
		v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Create(ctx, v, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, source
		v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue,
			Reason: v1alpha1.VMIReasonMigratable, LastTransitionTime: metav1.Now()}}
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "launcher-" + name, Labels: map[string]string{
				v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIName: name, v1alpha1.LabelVMIUID: string(v.UID)},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(v, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}},
			Spec: corev1.PodSpec{NodeName: source, AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}
		if _, err := cluster.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return pod.Name
	}
	lm := vm("lm", v1alpha1.EvictionStrategyLiveMigrate, true)
	lmip := vm("lmip", v1alpha1.EvictionStrategyLiveMigrateIfPossible, true)
	ext := vm("ext", v1alpha1.EvictionStrategyExternal, true)
	free := vm("free", v1alpha1.EvictionStrategyLiveMigrate, false)
	marked := func(name string) bool {
		v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && v.MarkedForEvacuation()
	}

	// The webhook's caches hold what was just made once a dry run of the last VM is answered as its.
	var code int32
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, msg = evict(t, ns, free, true)
		return strings.Contains(msg, webhook.EvacuationText), nil
	})
	if err != nil {
		t.Fatalf("a dry-run eviction of the free VM's pod: %d %q, want 429 %q", code, msg, webhook.EvacuationText)
	}

	want := `VMI "` + ns + `/lm" has eviction strategy LiveMigrate but cannot be live-migrated (NoTargetNode: no other node labelled lifeboat.dev/kvm=true matches its nodeSelector ` + pin + `=yes)`
	start := time.Now()
	if code, msg = evict(t, ns, lm, false); code != 429 || !strings.Contains(msg, want) {
		t.Errorf("LiveMigrate, pinned: %d %q, want 429 containing %q", code, msg, want)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %s", took)
	}
	if marked("lm") {
		t.Error("LiveMigrate, pinned: marked for a migration no node can take")
	}
	if code, msg = evict(t, ns, lmip, false); code != 201 {
		t.Errorf("LiveMigrateIfPossible, pinned: %d %q, want the eviction granted (seed 000: as None)", code, msg)
	}
	if marked("lmip") {
		t.Error("LiveMigrateIfPossible, pinned: marked")
	}
	if code, msg = evict(t, ns, ext, false); code != 429 || !strings.Contains(msg, webhook.EvacuationText) {
		t.Errorf("External, pinned: %d %q, want 429 %q as always", code, msg, webhook.EvacuationText)
	}
	if !marked("ext") {
		t.Error("External, pinned: not marked")
	}
	if code, msg = evict(t, ns, free, false); code != 429 || !strings.Contains(msg, webhook.EvacuationText) {
		t.Errorf("LiveMigrate, free to go: %d %q, want 429 %q", code, msg, webhook.EvacuationText)
	}
	if !marked("free") {
		t.Error("LiveMigrate, free to go: not marked")
	}

	// Another node gets the label: the pinned LiveMigrate VM may go there, and is marked.
	patch := []byte(`{"metadata":{"labels":{"` + pin + `":"yes"}}}`)
	if _, err := cluster.Kube.CoreV1().Nodes().Patch(ctx, "pinned-other-"+ns, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, msg = evict(t, ns, lm, false)
		return strings.Contains(msg, webhook.EvacuationText), nil
	})
	if err != nil || !marked("lm") {
		t.Errorf("LiveMigrate once another node matches: %d %q, want 429 %q and a mark", code, msg, webhook.EvacuationText)
	}
}
