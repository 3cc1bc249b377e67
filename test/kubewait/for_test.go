package kubewait

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// recorder is a testing.TB whose Fatalf records the message and ends the goroutine, as the
// testing package's does.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic(r)
}

func run(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != r {
				panic(p)
			}
		}()
		fn(r)
	}()
	return r.msg
}

func TestForReturnsTheValueThatHolds(t *testing.T) {
	n := 0
	got := For(t, 5*time.Second, "three", func(context.Context) (int, error) { n++; return n, nil }, func(v int) bool { return v == 3 }, nil)
	if got != 3 {
		t.Fatalf("For returned %d, want 3", got)
	}
}

func TestForSaysWhatItLastSawAndWhyItLastFailed(t *testing.T) {
	calls := 0
	msg := run(t, func(tb testing.TB) {
		For(tb, 500*time.Millisecond, "a ready thing", func(context.Context) (string, error) {
			calls++
			if calls == 1 {
				return "half ready", nil
			}
			return "", errors.New("connection refused")
		}, func(string) bool { return false }, func(s string) string { return "<" + s + ">" })
	})
	for _, want := range []string{"want a ready thing within 500ms", "last seen <half ready>", "the last read failed: connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("For's failure %q lacks %q", msg, want)
		}
	}
	msg = run(t, func(tb testing.TB) {
		For(tb, 300*time.Millisecond, "anything", func(context.Context) (int, error) { return 0, errors.New("forbidden") }, func(int) bool { return true }, nil)
	})
	if !strings.Contains(msg, "nothing could be read") || !strings.Contains(msg, "forbidden") {
		t.Errorf("For that never read says %q; want that nothing could be read and why", msg)
	}
}

func TestGoneFailsOnReadErrorsAndOnWhatStays(t *testing.T) {
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p")
	Gone(t, time.Second, "pod p", func(context.Context) error { return notFound })
	if msg := run(t, func(tb testing.TB) {
		Gone(tb, 300*time.Millisecond, "pod p", func(context.Context) error { return nil })
	}); !strings.Contains(msg, "still there") {
		t.Errorf("Gone of a pod that stays says %q", msg)
	}
	if msg := run(t, func(tb testing.TB) {
		Gone(tb, 300*time.Millisecond, "pod p", func(context.Context) error { return errors.New("forbidden") })
	}); !strings.Contains(msg, "the last read failed: forbidden") {
		t.Errorf("Gone whose reads fail says %q; a read error is not absence", msg)
	}
}

func TestConsistentlyFailsOnAReadError(t *testing.T) {
	if msg := run(t, func(tb testing.TB) {
		Consistently(tb, time.Second, "nothing marked", func(context.Context) error { return errors.New("forbidden") })
	}); !strings.Contains(msg, "forbidden") {
		t.Errorf("Consistently whose check fails says %q", msg)
	}
}
