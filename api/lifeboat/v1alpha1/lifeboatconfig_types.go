package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConfigName is the only name a LifeboatConfig may have.
const ConfigName = "cluster"

// FeatureGate names an optional lifeboat behaviour a cluster admin turns on.
// +kubebuilder:validation:Enum=NodePressureEvictionLiveMigration
type FeatureGate string

const (
	// FeatureGateNodePressureEvictionLiveMigration turns the kubelet's node-pressure
	// eviction of a VM pod into an evacuation, as the VM's eviction strategy says (seed 001).
	FeatureGateNodePressureEvictionLiveMigration FeatureGate = "NodePressureEvictionLiveMigration"
)

// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=lifeboat
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'cluster'",message="the LifeboatConfig must be named 'cluster'; there is one per cluster"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.evictionWebhook) || !has(oldSelf.status.evictionWebhook.authenticatedCallSeen) || (has(self.status) && has(self.status.evictionWebhook) && has(self.status.evictionWebhook.authenticatedCallSeen) && self.status.evictionWebhook.authenticatedCallSeen == oldSelf.status.evictionWebhook.authenticatedCallSeen)",message="status.evictionWebhook.authenticatedCallSeen cannot be changed or removed once set: the eviction webhook stays strict (docs/operations.md)"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Webhook Strict",type=string,JSONPath=`.status.conditions[?(@.type=="EvictionWebhookStrict")].status`
// +kubebuilder:printcolumn:name="VMs At Risk",type=string,JSONPath=`.status.conditions[?(@.type=="VMsAtRisk")].status`
// +kubebuilder:printcolumn:name="Eviction Strategy",type=string,JSONPath=`.spec.evictionStrategy`
// +kubebuilder:printcolumn:name="Feature Gates",type=string,JSONPath=`.spec.featureGates`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Webhook Reason",type=string,JSONPath=`.status.conditions[?(@.type=="EvictionWebhookStrict")].reason`,priority=1

// LifeboatConfig is lifeboat's cluster-wide configuration. There is one, named "cluster".
type LifeboatConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec LifeboatConfigSpec `json:"spec,omitempty"`

	// +optional
	Status LifeboatConfigStatus `json:"status,omitempty"`
}

// LifeboatConfigSpec is the cluster admin's configuration.
type LifeboatConfigSpec struct {
	// FeatureGates lists the optional behaviours turned on.
	// +listType=set
	// +optional
	FeatureGates []FeatureGate `json:"featureGates,omitempty"`

	// EvictionStrategy applies to VMIs that do not set their own. Unset means None.
	// +optional
	EvictionStrategy *EvictionStrategy `json:"evictionStrategy,omitempty"`

	// Migrations limits and tunes live migrations.
	// +kubebuilder:default={}
	// +optional
	Migrations MigrationsConfig `json:"migrations,omitempty"`

	// NodePressureRelief moves VMs off a node whose memory.available comes near the kubelet's
	// eviction threshold, before the kubelet has to evict anything.
	// +optional
	NodePressureRelief *NodePressureReliefConfig `json:"nodePressureRelief,omitempty"`

	// AllowedNodeDirectories are the node directories whose files a VMI's spec.boot may name.
	// Empty (the default) means none: a VMI that names a node path is refused at admission and
	// gets no launcher pod. A launcher pod mounts only the listed directories its VMI uses, and
	// the launcher refuses a file that resolves (through symlinks) out of its directory.
	// Everyone who may create a VMI can read these directories, and write a disk image in them.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^(/[^/]+)+$`
	// +kubebuilder:validation:XValidation:rule="self.all(d, !d.split('/').exists(s, s == '..' || s == '.'))",message="allowedNodeDirectories must be clean absolute paths, without . or .. and not /"
	// +listType=set
	// +optional
	AllowedNodeDirectories []string `json:"allowedNodeDirectories,omitempty"`

	// EvictionWebhook bounds what the eviction webhook does for a review it cannot authenticate.
	// +kubebuilder:default={}
	// +optional
	EvictionWebhook EvictionWebhookConfig `json:"evictionWebhook,omitempty"`
}

// EvictionWebhookConfig bounds the eviction webhook's permissive mode (docs/operations.md), where
// the API server presents no client certificate and anyone who reaches the webhook could post a
// review: such a review may start only a live migration.
type EvictionWebhookConfig struct {
	// UnauthenticatedMigrationInterval is how long after a VMI's last evacuation (its mark, or the
	// mark's end) an eviction review the webhook cannot authenticate may mark it again, unless
	// its node is cordoned: a forged review moves a VM at most once per interval.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="unauthenticatedMigrationInterval must be at least 1m"
	// +kubebuilder:default="1h"
	// +optional
	UnauthenticatedMigrationInterval *metav1.Duration `json:"unauthenticatedMigrationInterval,omitempty"`
}

// ConfigConditionReady is True while a controller replica leads and runs the controllers, the
// CRDs are as its types expect and the eviction webhook is registered; its reason and message
// say what is missing otherwise. The leader writes it, and False (NoLeader) when it stops leading.
const ConfigConditionReady = "Ready"

// ConfigConditionEvictionWebhookStrict is True where the eviction webhook acts only for the API
// server, known by its client certificate, and False where it also acts, within bounds, on
// reviews it cannot authenticate.
const ConfigConditionEvictionWebhookStrict = "EvictionWebhookStrict"

// ConfigConditionVMsAtRisk is True while some node has a VM that neither its kubelet's eviction
// grace nor node-pressure relief can save from memory pressure; its message names the nodes.
const ConfigConditionVMsAtRisk = "VMsAtRisk"

// LifeboatConfigStatus is what lifeboat-controller observed of the cluster.
type LifeboatConfigStatus struct {
	// Conditions: Ready, EvictionWebhookStrict, VMsAtRisk.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// EvictionWebhook is what the eviction webhook has seen of its callers.
	// +optional
	EvictionWebhook *EvictionWebhookStatus `json:"evictionWebhook,omitempty"`
}

// EvictionWebhookStatus is what the eviction webhook has seen of its callers.
type EvictionWebhookStatus struct {
	// AuthenticatedCallSeen is when a replica of the webhook first saw the API server present its
	// client certificate. From then on every replica acts only for callers that present it,
	// across restarts; the field cannot be removed (to go back, delete and recreate the
	// LifeboatConfig).
	// +optional
	AuthenticatedCallSeen *metav1.Time `json:"authenticatedCallSeen,omitempty"`
}

// NodePressureReliefConfig is when node agents move VMs ahead of the kubelet's node-pressure eviction.
type NodePressureReliefConfig struct {
	// Enabled turns relief on (true) or off (false). Unset, each agent turns it on for its node
	// where the kubelet's eviction grace is too short for the node's largest VM to migrate
	// (docs/operations.md, "The kubelet's eviction settings").
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// Margin above the kubelet's soft memory.available threshold (its hard one where there is no
	// soft) at which an agent starts moving VMs: the memory the node may still lose while a VM
	// migrates away. 512Mi covers a 1 GiB VM's 16 s migration at 64 MiB/s while the node's use
	// grows by 30 MiB/s.
	// +kubebuilder:default="512Mi"
	// +optional
	Margin *resource.Quantity `json:"margin,omitempty"`
}

// MigrationsConfig limits and tunes live migrations.
type MigrationsConfig struct {
	// ParallelMigrationsPerCluster is the most migrations running at once in the cluster.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=5
	// +optional
	ParallelMigrationsPerCluster *int32 `json:"parallelMigrationsPerCluster,omitempty"`

	// ParallelOutboundMigrationsPerNode is the most migrations leaving one node at once.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=2
	// +optional
	ParallelOutboundMigrationsPerNode *int32 `json:"parallelOutboundMigrationsPerNode,omitempty"`

	// ParallelManualMigrationsPerCluster is the most Manual migrations (those people create,
	// not the evacuation controller) waiting for or running on a target at once in the cluster.
	// They have a limit of their own so that no one's migrations hold back evacuations, which
	// count only against the two limits above; one past it fails at once.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=5
	// +optional
	ParallelManualMigrationsPerCluster *int32 `json:"parallelManualMigrationsPerCluster,omitempty"`

	// BandwidthPerMigration caps each migration's transfer rate in bytes per second, for example 64Mi.
	// Unset or zero means no cap.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="bandwidthPerMigration cannot be negative"
	// +optional
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`

	// UnschedulablePendingTimeoutSeconds is how long a migration waits for its target pod while
	// the scheduler finds no node for it; then the migration fails and frees its slot (KubeVirt's
	// setting of the same name and default).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=300
	// +optional
	UnschedulablePendingTimeoutSeconds *int64 `json:"unschedulablePendingTimeoutSeconds,omitempty"`

	// CatchAllPendingTimeoutSeconds is how long a migration waits for its target pod to run,
	// whatever holds it back (an image that cannot be pulled, a container that cannot start).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=900
	// +optional
	CatchAllPendingTimeoutSeconds *int64 `json:"catchAllPendingTimeoutSeconds,omitempty"`

	// AllowAutoConverge lets a migration throttle the guest's vCPUs to converge before its deadline.
	// +kubebuilder:default=true
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`

	// AllowPostCopy lets a migration switch to post-copy. Off by default: a network failure
	// during post-copy loses the guest, since its memory is split between two nodes.
	// +kubebuilder:default=false
	// +optional
	AllowPostCopy *bool `json:"allowPostCopy,omitempty"`

	// AllowPause lets a migration pause the guest briefly, as a last resort, to finish before its deadline.
	// +kubebuilder:default=true
	// +optional
	AllowPause *bool `json:"allowPause,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// LifeboatConfigList is a list of LifeboatConfigs.
type LifeboatConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LifeboatConfig `json:"items"`
}
