package controlplane

import (
	"context"
	"testing"
)

// BenchmarkStart measures the time from Start to a control plane ready for tests (API server
// ready, CRDs Established and, with the controller manager, the default service account),
// with cached binaries. The apiserver-only case is the baseline the full case is compared with.
func BenchmarkStart(b *testing.B) {
	if _, err := EnsureBinaries(context.Background(), nil); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"apiserver-only", Options{WithoutControllerManager: true, WithoutScheduler: true}},
		{"full", Options{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				cp, err := Start(context.Background(), bc.opts)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				cp.Stop()
				b.StartTimer()
			}
		})
	}
}
