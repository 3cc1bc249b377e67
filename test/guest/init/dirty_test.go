package main

import (
	"testing"
	"time"
)

func TestPagesDue(t *testing.T) {
	tests := []struct {
		name    string
		rate    int64
		elapsed time.Duration
		want    int64
	}{
		{name: "start", rate: 4 << 20, elapsed: 0, want: 0},
		{name: "one second", rate: 4 << 20, elapsed: time.Second, want: 1024},
		{name: "half a second", rate: 4 << 20, elapsed: 500 * time.Millisecond, want: 512},
		{name: "less than a page so far", rate: 4096, elapsed: 500 * time.Millisecond, want: 0},
		{name: "an hour at 1 GiB/s does not overflow", rate: 1 << 30, elapsed: time.Hour, want: 3600 << 18},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pagesDue(tt.rate, tt.elapsed, 4096); got != tt.want {
				t.Errorf("pagesDue() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestMemAvailable(t *testing.T) {
	meminfo := "MemTotal:         118840 kB\nMemFree:           92412 kB\nMemAvailable:      88160 kB\nBuffers:               0 kB\n"
	got, err := memAvailable(meminfo)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(88160) << 10; got != want {
		t.Errorf("memAvailable() = %d, want %d", got, want)
	}
	if _, err := memAvailable("MemTotal: 1 kB\n"); err == nil {
		t.Error("memAvailable() without a MemAvailable line succeeded, want an error")
	}
}
