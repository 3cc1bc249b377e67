package readiness

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

var cluster *controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, &cluster, controlplane.Options{WithoutControllerManager: true, WithoutScheduler: true})
}

// Against the real API server, with the CRDs of this checkout: Ready is False while the webhook
// is not registered, True once it is, and False (NoLeader) when the leader stops.
func TestTheLeaderKeepsReady(t *testing.T) {
	ctx := context.Background()
	lb := cluster.Lifeboat.LifeboatV1alpha1()
	if _, err := lb.LifeboatConfigs().Create(ctx, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	factory := lifeboatinformers.NewSharedInformerFactory(cluster.Lifeboat, 0)
	c := New(cluster.Kube, cluster.Lifeboat, factory.Lifeboat().V1alpha1().LifeboatConfigs(), "replica-a", true, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c.interval = 200 * time.Millisecond
	factory.Start(runCtx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	waitReady := func(status metav1.ConditionStatus, reason string) *metav1.Condition {
		t.Helper()
		var got *metav1.Condition
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			config, err := lb.LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			got = meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionReady)
			return got != nil && got.Status == status && got.Reason == reason, nil
		})
		if err != nil {
			t.Fatalf("Ready %s %s: %v; last %+v", status, reason, err, got)
		}
		t.Logf("Ready %s %s: %s", status, reason, got.Message)
		return got
	}
	waitReady(metav1.ConditionFalse, ReasonWebhookNotRegistered)

	hook, err := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, controlplane.InertEvictionWebhook("lifeboat-eviction", "readiness-test"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, hook.Name, metav1.DeleteOptions{})
	}()
	waitReady(metav1.ConditionTrue, ReasonReady)

	// kubectl get shows it in the printer columns.
	out, err := cluster.Kubectl(ctx, "get", "lifeboatconfig", v1alpha1.ConfigName, "-o", "wide")
	if err != nil {
		t.Fatalf("kubectl get lifeboatconfig: %v\n%s", err, out)
	}
	t.Logf("kubectl get lifeboatconfig -o wide:\n%s", out)
	if want := "READY   WEBHOOK STRICT   VMS AT RISK"; !strings.Contains(out, want) || !strings.Contains(out, "True") || !strings.Contains(out, ReasonReady) {
		t.Errorf("kubectl get lifeboatconfig -o wide does not show Ready (%q, True, %s)", want, ReasonReady)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitReady(metav1.ConditionFalse, ReasonNoLeader)
}
