package v1alpha1

// NodeEvictionExposure is what an agent found its node kubelet's eviction settings to mean for
// the VMs on it, published as the Node's AnnotationEvictionExposure: each agent writes its own
// node's, and lifeboat-controller gathers them into the LifeboatConfig's VMsAtRisk condition.
// +k8s:deepcopy-gen=false
type NodeEvictionExposure struct {
	// Source is where the settings came from: "configz" (the kubelet's live configuration),
	// "file" (--kubelet-config) or "defaults" (nothing could be read: upstream defaults assumed).
	Source string `json:"source"`
	// Threshold is the memory.available threshold that acts first ("soft", "hard", or "" for
	// none) and GraceSeconds the grace the kubelet gives a VM pod it evicts there.
	Threshold    string  `json:"threshold,omitempty"`
	GraceSeconds float64 `json:"graceSeconds"`
	// LargestVMBytes is the memory of the node's largest VM that would live-migrate, and
	// MigrationSeconds the least time that takes at the configured bandwidth.
	LargestVMBytes   uint64  `json:"largestVMBytes,omitempty"`
	MigrationSeconds float64 `json:"migrationSeconds,omitempty"`
	// Relief is whether node-pressure relief is on for the node.
	Relief bool `json:"relief"`
	// AtRisk: a VM on the node can be saved neither by the grace nor by relief.
	AtRisk bool `json:"atRisk"`
	// Message says all this for a person.
	Message string `json:"message"`
}
