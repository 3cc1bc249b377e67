package pressure

import (
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"
)

// KubeletSettings are the settings by which a kubelet evicts a VM pod for memory.
type KubeletSettings struct {
	Thresholds
	// MaxPodGracePeriod is evictionMaxPodGracePeriod in seconds: the most a soft eviction waits.
	MaxPodGracePeriod int64
}

// UpstreamKubeletSettings are a kubelet's when its configuration changes none of them (v1.37.1):
// no soft threshold, a hard one at memory.available<100Mi, evictionMaxPodGracePeriod 0.
var UpstreamKubeletSettings = KubeletSettings{Thresholds: Thresholds{Hard: kubeletDefaultHard}}

// ReadKubeletConfig reads the settings from a KubeletConfiguration file, or from the kubelet's
// /configz answer ({"kubeletconfig": {...}}), which holds the same fields with every default
// filled in (and, from kubelets before 1.3x, no kind).
func ReadKubeletConfig(data []byte) (KubeletSettings, error) {
	var configz struct {
		KubeletConfig json.RawMessage `json:"kubeletconfig"`
	}
	if err := yaml.Unmarshal(data, &configz); err != nil {
		return KubeletSettings{}, fmt.Errorf("reading the kubelet configuration: %w", err)
	}
	if configz.KubeletConfig != nil {
		var fields map[string]any
		if err := json.Unmarshal(configz.KubeletConfig, &fields); err != nil {
			return KubeletSettings{}, fmt.Errorf("reading the kubelet's /configz: %w", err)
		}
		fields["kind"] = "KubeletConfiguration"
		var err error
		if data, err = json.Marshal(fields); err != nil {
			return KubeletSettings{}, err
		}
	}
	t, err := ThresholdsFromKubeletConfig(data)
	if err != nil {
		return KubeletSettings{}, err
	}
	var cfg struct {
		EvictionMaxPodGracePeriod int64 `json:"evictionMaxPodGracePeriod"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return KubeletSettings{}, fmt.Errorf("reading the kubelet configuration: %w", err)
	}
	if cfg.EvictionMaxPodGracePeriod < 0 {
		return KubeletSettings{}, fmt.Errorf("evictionMaxPodGracePeriod is negative (%d)", cfg.EvictionMaxPodGracePeriod)
	}
	return KubeletSettings{Thresholds: t, MaxPodGracePeriod: cfg.EvictionMaxPodGracePeriod}, nil
}
