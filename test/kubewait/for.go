package kubewait

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
)

// pollInterval is how often For and Gone look.
const pollInterval = 200 * time.Millisecond

// For polls get until ok holds for what it read, and returns that. Past timeout it fails the
// test with what was wanted, the last value read (through show, or %+v when show is nil) and the
// last read's error, so that a failure says how far things got and whether they could be read.
func For[T any](t testing.TB, timeout time.Duration, what string, get func(context.Context) (T, error), ok func(T) bool, show func(T) string) T {
	t.Helper()
	var last T
	var seen bool
	var readErr error
	err := wait.PollUntilContextTimeout(context.Background(), pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		v, err := get(ctx)
		if readErr = err; err != nil {
			return false, nil
		}
		last, seen = v, true
		return ok(v), nil
	})
	if err == nil {
		return last
	}
	var saw string
	switch {
	case !seen:
		saw = "nothing could be read"
	case show != nil:
		saw = "last seen " + show(last)
	default:
		saw = fmt.Sprintf("last seen %+v", last)
	}
	if readErr != nil {
		saw += fmt.Sprintf("; the last read failed: %v", readErr)
	}
	t.Fatalf("want %s within %s; %s", what, timeout, saw)
	return last
}

// Gone polls get until the object it reads is not found, and fails the test past timeout with
// the last answer: an object still there, or an error other than NotFound.
func Gone(t testing.TB, timeout time.Duration, what string, get func(context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		last = get(ctx)
		return apierrors.IsNotFound(last), nil
	})
	if err == nil {
		return
	}
	if last == nil {
		t.Fatalf("want %s gone within %s; it is still there", what, timeout)
	}
	t.Fatalf("want %s gone within %s; the last read failed: %v", what, timeout, last)
}
