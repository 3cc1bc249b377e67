package readiness

import (
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/evacuation/check"
)

// Ready is True only when the leader runs, every CRD is current and the webhook is served and
// registered; otherwise the first missing thing is the reason, and the message says what to do.
func TestCondition(t *testing.T) {
	current := []check.Result{{Check: "CRD a", Status: check.OK}, {Check: "CRD b", Status: check.OK}}
	older := []check.Result{{Check: "CRD a", Status: check.OK}, {Check: "CRD b", Status: check.Fail, Message: "older than this kubectl-lifeboat"}}
	newer := []check.Result{{Check: "CRD a", Status: check.Warn, Message: "newer than this kubectl-lifeboat"}}
	registered := Webhook{Served: true, Registered: true}
	for _, tc := range []struct {
		name   string
		in     Input
		status metav1.ConditionStatus
		reason string
		words  []string
	}{
		{"all well", Input{Leader: "r1", CRDs: current, Webhook: registered}, metav1.ConditionTrue, ReasonReady,
			[]string{"replica r1 leads", "EvictionWebhookStrict", "VMsAtRisk"}},
		{"a CRD older than the controller", Input{Leader: "r1", CRDs: older, Webhook: registered}, metav1.ConditionFalse, ReasonCRDsNotCurrent,
			[]string{"CRD b: older", "kubectl apply --server-side -f manifests/crds/"}},
		{"a CRD newer than the controller", Input{Leader: "r1", CRDs: newer, Webhook: registered}, metav1.ConditionFalse, ReasonCRDsNotCurrent, []string{"newer"}},
		{"no webhook served", Input{Leader: "r1", CRDs: current}, metav1.ConditionFalse, ReasonWebhookNotServed, []string{"--webhook-listen"}},
		{"webhook not registered", Input{Leader: "r1", CRDs: current, Webhook: Webhook{Served: true, Problem: "no ValidatingWebhookConfiguration lifeboat-eviction"}},
			metav1.ConditionFalse, ReasonWebhookNotRegistered, []string{"no ValidatingWebhookConfiguration lifeboat-eviction", "logs deploy/lifeboat-controller"}},
	} {
		c := Condition(tc.in)
		if c.Type != "Ready" || c.Status != tc.status || c.Reason != tc.reason {
			t.Errorf("%s: %s %s %s, want %s %s", tc.name, c.Type, c.Status, c.Reason, tc.status, tc.reason)
		}
		for _, w := range tc.words {
			if !strings.Contains(c.Message, w) {
				t.Errorf("%s: %q does not say %q", tc.name, c.Message, w)
			}
		}
	}
	if c := Stopped("r1", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)); c.Status != metav1.ConditionFalse || c.Reason != ReasonNoLeader ||
		!strings.Contains(c.Message, "replica r1 stopped leading at 2026-01-02T03:04:05Z") {
		t.Errorf("Stopped = %+v", c)
	}
}

func TestRegistration(t *testing.T) {
	hook := func(ca []byte, url *string) *admissionregistrationv1.ValidatingWebhookConfiguration {
		return &admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "eviction.lifeboat.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: ca, URL: url}}}}
	}
	for _, tc := range []struct {
		name   string
		config *admissionregistrationv1.ValidatingWebhookConfiguration
		ok     bool
		words  string
	}{
		{"none", nil, false, "no ValidatingWebhookConfiguration"},
		{"no CA bundle", hook(nil, ptr.To("https://x/validate-eviction")), false, "without a CA bundle"},
		{"no endpoint", hook([]byte("ca"), nil), false, "neither a URL nor a Service"},
		{"another webhook only", &admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "other"}}}, false, "has no webhook eviction.lifeboat.dev"},
		{"registered", hook([]byte("ca"), ptr.To("https://x/validate-eviction")), true, ""},
	} {
		ok, problem := Registration(tc.config)
		if ok != tc.ok || !strings.Contains(problem, tc.words) {
			t.Errorf("%s: Registration = %v, %q; want %v and %q", tc.name, ok, problem, tc.ok, tc.words)
		}
	}
}
