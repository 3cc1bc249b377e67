// Package kubewait waits, in tests, for what Kubernetes records.
package kubewait

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Event polls namespace ns until an Event matching the field set exists (such as
// involvedObject.name and reason) and returns it; it fails the test after timeout.
func Event(t testing.TB, client kubernetes.Interface, ns string, match fields.Set, timeout time.Duration) *corev1.Event {
	t.Helper()
	var found *corev1.Event
	sel := match.AsSelector().String()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil || len(evs.Items) == 0 {
			return false, nil
		}
		found = &evs.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no event with %s in namespace %s within %s", sel, ns, timeout)
	}
	return found
}

// consistentlyInterval is how often Consistently looks, and consistentlyCheckTimeout how long
// one look may take.
const (
	consistentlyInterval     = 100 * time.Millisecond
	consistentlyCheckTimeout = 10 * time.Second
)

// Consistently checks, every 100 ms for window, that something does not happen: check returns
// an error saying what happened. It fails the test at the first such error. One look cannot
// show that nothing happens; a late change would pass it.
func Consistently(t testing.TB, window time.Duration, what string, check func(context.Context) error) {
	t.Helper()
	done := time.After(window)
	start := time.Now()
	ticker := time.NewTicker(consistentlyInterval)
	defer ticker.Stop()
	for {
		// Each look has its own deadline, not the window's: a read cut short by the window's
		// end (a client's rate limiter refuses one that would pass it) is no answer.
		ctx, cancel := context.WithTimeout(context.Background(), consistentlyCheckTimeout)
		err := check(ctx)
		cancel()
		if err != nil {
			t.Fatalf("want %s for %s; after %s: %v", what, window, time.Since(start).Round(time.Millisecond), err)
		}
		select {
		case <-done:
			return
		case <-ticker.C:
		}
	}
}
