package e2e

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
	"github.com/lifeboat-vm/lifeboat/evacuation/readiness"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// predictDrain asserts what kubectl lifeboat status would say a drain does to each VMI (issue
// 46), from the live objects, before the test drains: the verdicts by VMI name.
func predictDrain(t *testing.T, ns string, want map[string]string) {
	t.Helper()
	ctx := context.Background()
	config, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cluster.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	registered, _ := readiness.Registration(hook)
	p := check.ProtectionOf(config)
	cf := check.ClusterFacts{Gate: p.Gate, Webhook: registered, WebhookKnown: true, Bandwidth: p.Bandwidth, Margin: p.Margin}
	for name, verdict := range want {
		vmi := getVMI(t, ns, name)
		if got := check.IfDrained(check.FactsOf(vmi, config, nodes.Items), cf); got.Verdict != verdict {
			t.Errorf("a drain of %s's node: predicted %q, want %q", name, got, verdict)
		} else {
			t.Logf("a drain of %s's node: %s", name, got)
		}
	}
}

// waitConfigReady waits for the LifeboatConfig's Ready condition to be True, as a controller
// serving its webhook, with this checkout's CRDs, writes it.
func waitConfigReady(t *testing.T) {
	t.Helper()
	var got *metav1.Condition
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		config, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionReady)
		return got != nil && got.Status == metav1.ConditionTrue && got.Reason == readiness.ReasonReady, nil
	})
	if err != nil {
		t.Fatalf("the LifeboatConfig is not Ready: %+v", got)
	}
}
