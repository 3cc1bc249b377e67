package e2e

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// slowClients is how many connections the attacker holds open against each server.
const slowClients = 1000

// holdSlowConnections opens n connections to addr, each sending the first bytes of a request
// and then nothing, as a slow-loris client does; they are closed when t ends.
func holdSlowConnections(t *testing.T, addr string, first []byte, n int) {
	t.Helper()
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("slow connection %d of %d to %s: %v", i+1, n, addr, err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(first); err != nil {
			t.Fatalf("slow connection %d to %s: %v", i+1, addr, err)
		}
	}
}

// TestSlowClientsDoNotStarveTheEndpoints holds 1,000 slow connections open against the
// eviction webhook, the controller's metrics and the agent's metrics, then makes one real
// request of each: each is answered within its caller's normal timeout (the API server waits
// 5 s for the webhook, a scrape 5 s for metrics).
func TestSlowClientsDoNotStarveTheEndpoints(t *testing.T) {
	ctrl := startControllerWithWebhook(t)
	n := startNodes(t, 1)[0]
	ns := testNamespace(t)

	hook, err := url.Parse(ctrl.url)
	if err != nil {
		t.Fatal(err)
	}
	// The start of a TLS ClientHello (record header) and of an HTTP request's headers.
	holdSlowConnections(t, hook.Host, []byte{0x16, 0x03, 0x01, 0x02, 0x00}, slowClients)
	partialGet := []byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")
	for _, metrics := range []string{ctrl.metrics, n.metrics} {
		u, err := url.Parse(metrics)
		if err != nil {
			t.Fatal(err)
		}
		holdSlowConnections(t, u.Host, partialGet, slowClients)
	}

	client := &http.Client{Timeout: 5 * time.Second}
	for _, metrics := range []string{ctrl.metrics, n.metrics} {
		resp, err := client.Get(metrics)
		if err != nil {
			t.Errorf("a scrape of %s behind %d slow clients: %v", metrics, slowClients, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("a scrape of %s behind %d slow clients: %s", metrics, slowClients, resp.Status)
		}
	}

	// The API server's call: an eviction of a pod named as launchers are reaches the webhook
	// (which finds no VM behind it and lets it through). With failurePolicy Ignore a call that
	// timed out would let it through too, so the webhook's own count says it answered.
	notAVM := `lifeboat_eviction_webhook_decisions_total{answer="allowed",strategy="NotAVM"}`
	before := max(metricValue(t, ctrl.metrics, notAVM), 0)
	pod, err := cluster.Kube.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-lookalike"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if code, msg := evictPod(t, pod, true); code != 201 {
		t.Fatalf("a dry-run eviction behind %d slow clients: %d %q, want it granted", slowClients, code, msg)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return metricValue(t, ctrl.metrics, notAVM) == before+1, nil
	})
	if err != nil {
		t.Errorf("the webhook did not answer the API server's call behind %d slow clients (%s stayed %v)", slowClients, notAVM, before)
	}
}
