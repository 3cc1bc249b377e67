package pressure

import (
	"testing"
	"time"
)

func TestReadKubeletConfig(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         KubeletSettings
		wantErr      bool
	}{
		{"an empty file: the upstream defaults", "kind: KubeletConfiguration\n", UpstreamKubeletSettings, false},
		{"a file with soft, hard and grace",
			"kind: KubeletConfiguration\nevictionSoft:\n  memory.available: 1Gi\nevictionHard:\n  memory.available: 100Mi\nevictionMaxPodGracePeriod: 60\n",
			KubeletSettings{Thresholds{Soft: Threshold{Bytes: 1 << 30}, Hard: Threshold{Bytes: 100 * mib}}, 60}, false},
		{"/configz of a default kubelet",
			`{"kubeletconfig":{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","evictionHard":{"imagefs.available":"15%","memory.available":"100Mi","nodefs.available":"10%","nodefs.inodesFree":"5%"},"evictionPressureTransitionPeriod":"5m0s"}}`,
			UpstreamKubeletSettings, false},
		{"/configz without kind (older kubelets)",
			`{"kubeletconfig":{"evictionSoft":{"memory.available":"10%"},"evictionHard":{"memory.available":"5%"},"evictionMaxPodGracePeriod":30}}`,
			KubeletSettings{Thresholds{Soft: Threshold{Percent: 10}, Hard: Threshold{Percent: 5}}, 30}, false},
		{"negative grace", "kind: KubeletConfiguration\nevictionMaxPodGracePeriod: -5\n", KubeletSettings{}, true},
		{"not a kubelet configuration", "kind: Pod\n", KubeletSettings{}, true},
		{"not YAML", ":\n\t-", KubeletSettings{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadKubeletConfig([]byte(tc.config))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ReadKubeletConfig() = %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestExpose(t *testing.T) {
	const gib = 1 << 30
	generous := KubeletSettings{Thresholds{Soft: Threshold{Bytes: 2 * gib}, Hard: Threshold{Bytes: 100 * mib}}, 60}
	for _, tc := range []struct {
		name string
		in   ExposureInput
		want Exposure
	}{
		{"upstream defaults: the hard threshold acts with a second's grace; relief comes on by itself",
			ExposureInput{Settings: UpstreamKubeletSettings, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true},
			Exposure{First: "hard", FirstBytes: 100 * mib, Grace: time.Second, LargestVM: gib, Migration: 18 * time.Second, Relief: true}},
		// Found on the stock cluster (test/stockcluster): 128 MiB at 10 Gbit/s is 0.1 s, but no
		// migration moves anything before its target pod has started.
		{"upstream defaults and a small VM with no cap: the second fits no target's start; relief comes on",
			ExposureInput{Settings: UpstreamKubeletSettings, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: 128 * mib, Evacuate: true},
			Exposure{First: "hard", FirstBytes: 100 * mib, Grace: time.Second, LargestVM: 128 * mib, Migration: TargetStart + time.Duration(128*mib)*time.Second/AssumedLinkRate, Assumed: true, Relief: true}},
		{"upstream defaults with relief turned off: at risk",
			ExposureInput{Settings: UpstreamKubeletSettings, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "hard", FirstBytes: 100 * mib, Grace: time.Second, LargestVM: gib, Migration: 18 * time.Second, AtRisk: true}},
		{"a soft threshold without evictionMaxPodGracePeriod: a second, too short",
			ExposureInput{Settings: KubeletSettings{Thresholds: generous.Thresholds}, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "soft", FirstBytes: 2 * gib, Grace: time.Second, LargestVM: gib, Migration: 18 * time.Second, AtRisk: true}},
		{"a generous soft threshold: the pod's grace, under evictionMaxPodGracePeriod, fits",
			ExposureInput{Settings: generous, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "soft", FirstBytes: 2 * gib, Grace: 45 * time.Second, LargestVM: gib, Migration: 18 * time.Second, GraceSaves: true}},
		{"a generous soft threshold, relief on anyway",
			ExposureInput{Settings: generous, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOn},
			Exposure{First: "soft", FirstBytes: 2 * gib, Grace: 45 * time.Second, LargestVM: gib, Migration: 18 * time.Second, GraceSaves: true, Relief: true}},
		{"the grace fits but the gate is off: an eviction shuts the VM down",
			ExposureInput{Settings: generous, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Relief: ReliefOff},
			Exposure{First: "soft", FirstBytes: 2 * gib, Grace: 45 * time.Second, LargestVM: gib, Migration: 18 * time.Second, AtRisk: true}},
		{"a VM too large for the grace at the bandwidth",
			ExposureInput{Settings: generous, Capacity: 64 * gib, PodGrace: 45 * time.Second, LargestVM: 4 * gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "soft", FirstBytes: 2 * gib, Grace: 45 * time.Second, LargestVM: 4 * gib, Migration: 66 * time.Second, AtRisk: true}},
		{"no bandwidth cap: the assumed link rate",
			ExposureInput{Settings: generous, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: 1250_000_000, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "soft", FirstBytes: 2 * gib, Grace: 45 * time.Second, LargestVM: 1250_000_000, Migration: 3 * time.Second, Assumed: true, GraceSaves: true}},
		{"a soft threshold below the hard one: the hard one acts first",
			ExposureInput{Settings: KubeletSettings{Thresholds{Soft: Threshold{Bytes: 50 * mib}, Hard: Threshold{Bytes: 100 * mib}}, 60}, Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "hard", FirstBytes: 100 * mib, Grace: time.Second, LargestVM: gib, Migration: 18 * time.Second, AtRisk: true}},
		{"percentages of the capacity",
			ExposureInput{Settings: KubeletSettings{Thresholds{Soft: Threshold{Percent: 10}, Hard: Threshold{Percent: 5}}, 30}, Capacity: 10 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Evacuate: true, Relief: ReliefOff},
			Exposure{First: "soft", FirstBytes: gib, Grace: 30 * time.Second, LargestVM: gib, Migration: 18 * time.Second, GraceSaves: true}},
		{"no VM that would migrate: nothing at risk",
			ExposureInput{Settings: UpstreamKubeletSettings, Capacity: 8 * gib, PodGrace: 45 * time.Second, Relief: ReliefOff},
			Exposure{First: "hard", FirstBytes: 100 * mib, Grace: time.Second, GraceSaves: true}},
		{"no memory threshold: the kubelet evicts nothing for memory",
			ExposureInput{Capacity: 8 * gib, PodGrace: 45 * time.Second, LargestVM: gib, Bandwidth: 64 * mib, Relief: ReliefOff},
			Exposure{LargestVM: gib, Migration: 18 * time.Second, GraceSaves: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Expose(tc.in); got != tc.want {
				t.Errorf("Expose() = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
