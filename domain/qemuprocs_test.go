package domain

import "testing"

func TestProcessState(t *testing.T) {
	tests := []struct {
		stat string
		want byte
	}{
		{"1234 (qemu-system-x86) S 1 1234 ...", 'S'},
		{"1234 (a) b) Z 1 ...", 'Z'},
		{"1234 (x", 0},
		{"", 0},
	}
	for _, tt := range tests {
		if got := processState(tt.stat); got != tt.want {
			t.Errorf("processState(%q) = %q, want %q", tt.stat, got, tt.want)
		}
	}
}
