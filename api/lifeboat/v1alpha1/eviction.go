package v1alpha1

// EvictionStrategy says what lifeboat does when a VM's pod is asked to leave its node,
// whether by the eviction API, a drain, an EvictionRequest or the kubelet under node pressure.
// +kubebuilder:validation:Enum=None;LiveMigrate;LiveMigrateIfPossible;External
type EvictionStrategy string

const (
	// EvictionStrategyNone lets the VM be shut down with its pod.
	EvictionStrategyNone EvictionStrategy = "None"
	// EvictionStrategyLiveMigrate moves the VM to another node and refuses to let it be
	// shut down while it cannot be moved.
	EvictionStrategyLiveMigrate EvictionStrategy = "LiveMigrate"
	// EvictionStrategyLiveMigrateIfPossible moves the VM when it is live-migratable and
	// otherwise behaves as None.
	EvictionStrategyLiveMigrateIfPossible EvictionStrategy = "LiveMigrateIfPossible"
	// EvictionStrategyExternal marks the VM for evacuation and leaves the rest to an
	// external controller (for example cluster-api-provider-kubevirt).
	EvictionStrategyExternal EvictionStrategy = "External"
)

// EvictionStrategies lists every eviction strategy, in the order the documentation gives them.
var EvictionStrategies = []EvictionStrategy{
	EvictionStrategyNone,
	EvictionStrategyLiveMigrate,
	EvictionStrategyLiveMigrateIfPossible,
	EvictionStrategyExternal,
}

// MigrationCause records why a migration exists (seed 001's open question).
// +kubebuilder:validation:Enum=NodePressure;NodePressureRelief;APIEviction;EvictionRequest;Drain;PodDeleted;Manual
type MigrationCause string

const (
	// MigrationCauseNodePressure: the kubelet's eviction manager sent the launcher SIGTERM.
	MigrationCauseNodePressure MigrationCause = "NodePressure"
	// MigrationCauseNodePressureRelief: the node's agent moves the VM before the kubelet has to
	// evict anything, its memory.available having come within the relief margin of the threshold.
	MigrationCauseNodePressureRelief MigrationCause = "NodePressureRelief"
	// MigrationCauseAPIEviction: someone called the pods/eviction subresource.
	MigrationCauseAPIEviction MigrationCause = "APIEviction"
	// MigrationCauseEvictionRequest: a lifecycle.k8s.io EvictionRequest named the VM's pod.
	MigrationCauseEvictionRequest MigrationCause = "EvictionRequest"
	// MigrationCauseDrain: the VM's node is being drained.
	MigrationCauseDrain MigrationCause = "Drain"
	// MigrationCausePodDeleted: the launcher pod was deleted through the API other than by an
	// eviction (kubectl delete pod, a controller); the kubelet kills it when its deletion grace ends.
	MigrationCausePodDeleted MigrationCause = "PodDeleted"
	// MigrationCauseManual: a person created the migration.
	MigrationCauseManual MigrationCause = "Manual"
)

// Recorded reports whether c is a cause lifeboat records from a mark or an annotation; anything
// else is taken for a person's migration (Manual).
func (c MigrationCause) Recorded() bool {
	switch c {
	case MigrationCauseNodePressure, MigrationCauseNodePressureRelief, MigrationCauseAPIEviction, MigrationCauseEvictionRequest, MigrationCauseDrain, MigrationCausePodDeleted:
		return true
	}
	return false
}

// MigrationMode is how far a migration has escalated to converge before its deadline.
// +kubebuilder:validation:Enum=PreCopy;AutoConverge;PostCopy;Paused
type MigrationMode string

const (
	// MigrationModePreCopy copies memory while the guest runs on the source.
	MigrationModePreCopy MigrationMode = "PreCopy"
	// MigrationModeAutoConverge throttles the guest's vCPUs so pre-copy can catch up.
	MigrationModeAutoConverge MigrationMode = "AutoConverge"
	// MigrationModePostCopy runs the guest on the target and pulls the remaining pages on demand.
	MigrationModePostCopy MigrationMode = "PostCopy"
	// MigrationModePaused pauses the guest so the remaining memory can be copied at once.
	MigrationModePaused MigrationMode = "Paused"
)
