package agent

import (
	"testing"
	"time"
)

func TestDialDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{0, 0},
		{1, 500 * time.Millisecond},
		{2, time.Second},
		{5, 8 * time.Second},
		{10, 256 * time.Second},
		{11, 5 * time.Minute},
		{1000, 5 * time.Minute},
	} {
		if got := DialDelay(tc.failures); got != tc.want {
			t.Errorf("DialDelay(%d) = %s, want %s", tc.failures, got, tc.want)
		}
	}
}
