package manifests

import (
	"context"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	agentSA      = "lifeboat-agent"
	controllerSA = "lifeboat-controller"
	signerSA     = "lifeboat-signer"
)

// access is one request a component's service account makes, or must not be able to make.
type access struct {
	verb, group, resource, subresource, namespace, name string
}

// The rows are the calls in agent/, evacuation/ and cmd/ (and those issues 6 and 7 add), then
// the nearest calls the components never make, which least privilege must refuse.
var rbacCases = []struct {
	name    string
	sa      string
	access  access
	allowed bool
}{
	// The agent: its VMIs, migrations and the configuration through informers; status writes; Events.
	{"agent watches VMIs", agentSA, access{verb: "watch", group: "lifeboat.dev", resource: "virtualmachineinstances"}, true},
	{"agent lists VMIs", agentSA, access{verb: "list", group: "lifeboat.dev", resource: "virtualmachineinstances"}, true},
	{"agent gets a VMI", agentSA, access{verb: "get", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns", name: "vm"}, true},
	{"agent marks a VMI (status)", agentSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstances", subresource: "status", namespace: "ns", name: "vm"}, true},
	{"agent watches migrations", agentSA, access{verb: "watch", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations"}, true},
	{"agent gets a migration", agentSA, access{verb: "get", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns", name: "m"}, true},
	{"agent writes migration progress", agentSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", subresource: "status", namespace: "ns", name: "m"}, true},
	{"agent watches the configuration", agentSA, access{verb: "watch", group: "lifeboat.dev", resource: "lifeboatconfigs"}, true},
	{"agent records an Event", agentSA, access{verb: "create", resource: "events", namespace: "ns"}, true},
	{"agent updates a repeated Event", agentSA, access{verb: "patch", resource: "events", namespace: "ns", name: "e"}, true},
	// Issue 47: a guest whose VMI left the node is checked against the API server, live; the
	// agent probes the API server; the controller holds the VMs of a node that stops answering.
	{"agent lists a VMI's migrations, live, before destroying a stray guest", agentSA, access{verb: "list", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns"}, true},
	{"agent probes the API server with the configuration", agentSA, access{verb: "get", group: "lifeboat.dev", resource: "lifeboatconfigs", name: "cluster"}, true},
	{"agent reports an outage on its Node (an Event in default)", agentSA, access{verb: "create", resource: "events", namespace: "default"}, true},
	{"controller watches nodes, to hold the VMs of one that stops answering", controllerSA, access{verb: "watch", resource: "nodes"}, true},
	// Issue 48: a migration's source pod forwards to the target pod until no EndpointSlice lists it.
	{"agent lists a namespace's EndpointSlices, to end a source pod's forward", agentSA, access{verb: "list", group: "discovery.k8s.io", resource: "endpointslices", namespace: "ns"}, true},
	{"agent may not change EndpointSlices", agentSA, access{verb: "update", group: "discovery.k8s.io", resource: "endpointslices", namespace: "ns", name: "s"}, false},
	{"agent may not change a VMI's spec", agentSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns", name: "vm"}, false},
	{"agent may not create migrations", agentSA, access{verb: "create", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns"}, false},
	{"agent may not change the configuration", agentSA, access{verb: "update", group: "lifeboat.dev", resource: "lifeboatconfigs", name: "cluster"}, false},
	{"agent may not create pods", agentSA, access{verb: "create", resource: "pods", namespace: "ns"}, false},
	{"agent lists the pods of a VMI to learn how its launcher ended", agentSA, access{verb: "list", resource: "pods", namespace: "ns"}, true},
	{"agent lists its node's launcher pods in every namespace, to remove the directories of deleted ones", agentSA, access{verb: "list", resource: "pods"}, true},
	{"agent may not delete pods", agentSA, access{verb: "delete", resource: "pods", namespace: "ns", name: "p"}, false},
	{"agent watches its node's launcher pods, to read a SIGTERM that follows a deletion", agentSA, access{verb: "watch", resource: "pods"}, true},
	{"agent may not read secrets", agentSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "lifeboat-webhook-tls"}, false},
	{"agent may not read nodes", agentSA, access{verb: "get", resource: "nodes", name: "n"}, false},
	{"agent labels and annotates its node (the policy keeps it to its own node, that label and that annotation)", agentSA, access{verb: "patch", resource: "nodes", name: "n"}, true},
	{"agent may not update a node whole", agentSA, access{verb: "update", resource: "nodes", name: "n"}, false},
	{"agent reads its kubelet's live configuration (/configz)", agentSA, access{verb: "get", resource: "nodes", subresource: "configz", name: "n"}, true},
	{"agent may not proxy to a kubelet (exec into its pods)", agentSA, access{verb: "get", resource: "nodes", subresource: "proxy", name: "n"}, false},
	{"agent may not write a node's status", agentSA, access{verb: "patch", resource: "nodes", subresource: "status", name: "n"}, false},

	// The controller: VMI, evacuation and migration controllers.
	{"controller watches VMIs", controllerSA, access{verb: "watch", group: "lifeboat.dev", resource: "virtualmachineinstances"}, true},
	{"controller sets a VMI's finalizer", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns", name: "vm"}, true},
	{"controller writes a VMI's phase", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstances", subresource: "status", namespace: "ns", name: "vm"}, true},
	{"controller watches launcher pods", controllerSA, access{verb: "watch", resource: "pods"}, true},
	{"controller creates a launcher pod", controllerSA, access{verb: "create", resource: "pods", namespace: "ns"}, true},
	{"controller deletes a launcher pod", controllerSA, access{verb: "delete", resource: "pods", namespace: "ns", name: "p"}, true},
	{"controller creates a migration", controllerSA, access{verb: "create", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns"}, true},
	{"controller sets a migration's finalizer", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns", name: "m"}, true},
	{"controller writes a migration's phase", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", subresource: "status", namespace: "ns", name: "m"}, true},
	{"controller watches the configuration", controllerSA, access{verb: "watch", group: "lifeboat.dev", resource: "lifeboatconfigs"}, true},
	{"controller records an Event", controllerSA, access{verb: "create", resource: "events", namespace: "ns"}, true},
	// Leader election.
	{"controller creates its Lease", controllerSA, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "lifeboat-system"}, true},
	{"controller renews its Lease", controllerSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "lifeboat-system", name: "lifeboat-controller"}, true},
	{"controller may not take another Lease", controllerSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "lifeboat-system", name: "other"}, false},
	// Issue 47, the soak's defect 5: a target pod keeps off a node whose kubelet stopped renewing its Lease.
	{"controller lists the nodes' Leases", controllerSA, access{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"}, true},
	{"controller watches the nodes' Leases", controllerSA, access{verb: "watch", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"}, true},
	{"controller may not renew a node's Lease", controllerSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease", name: "n"}, false},
	{"controller may not list Leases elsewhere", controllerSA, access{verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system"}, false},
	{"controller may not take kube-system's Leases", controllerSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "lifeboat-controller"}, false},
	// Issue 6: the eviction webhook and its CA bundle, disruption budgets, descheduler annotations, cancelling.
	{"controller applies its webhook configuration with its CA bundle", controllerSA, access{verb: "patch", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "lifeboat-eviction"}, true},
	{"controller reads its webhook configuration to keep the other replicas' CAs", controllerSA, access{verb: "get", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "lifeboat-eviction"}, true},
	{"controller may not change other webhooks", controllerSA, access{verb: "patch", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "other"}, false},
	// Issue 46: the Ready condition reads lifeboat's CRDs, and no other.
	{"controller reads lifeboat's CRDs for its Ready condition", controllerSA, access{verb: "get", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "lifeboatconfigs.lifeboat.dev"}, true},
	{"controller reads the VMI CRD", controllerSA, access{verb: "get", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "virtualmachineinstances.lifeboat.dev"}, true},
	{"controller may not read other CRDs", controllerSA, access{verb: "get", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "other.example.org"}, false},
	{"controller may not change its CRDs", controllerSA, access{verb: "update", group: "apiextensions.k8s.io", resource: "customresourcedefinitions", name: "lifeboatconfigs.lifeboat.dev"}, false},
	{"controller may not list webhooks", controllerSA, access{verb: "list", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations"}, false},
	{"controller may not change mutating webhooks", controllerSA, access{verb: "patch", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "lifeboat-eviction"}, false},
	{"controller may not read secrets (its certificate lives in memory)", controllerSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "lifeboat-webhook-tls"}, false},
	{"controller watches disruption budgets", controllerSA, access{verb: "watch", group: "policy", resource: "poddisruptionbudgets"}, true},
	{"controller creates a VMI's disruption budget", controllerSA, access{verb: "create", group: "policy", resource: "poddisruptionbudgets", namespace: "ns"}, true},
	{"controller resizes a disruption budget", controllerSA, access{verb: "patch", group: "policy", resource: "poddisruptionbudgets", namespace: "ns", name: "b"}, true},
	{"controller deletes a disruption budget", controllerSA, access{verb: "delete", group: "policy", resource: "poddisruptionbudgets", namespace: "ns", name: "b"}, true},
	{"controller annotates a pod for the descheduler", controllerSA, access{verb: "patch", resource: "pods", namespace: "ns", name: "p"}, true},
	{"controller removes a handled cancel request", controllerSA, access{verb: "patch", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns", name: "vm"}, true},
	{"controller cancels a migration", controllerSA, access{verb: "delete", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns", name: "m"}, true},
	{"controller reads the claims of VMIs' volumes", controllerSA, access{verb: "watch", resource: "persistentvolumeclaims"}, true},
	{"controller sets the cause and deadline of its migrations", controllerSA, access{verb: "set-cause", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns"}, true},
	{"controller may not cancel evacuations", controllerSA, access{verb: "cancel-evacuation", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns", name: "vm"}, false},
	{"controller may not read a VM's user-data Secret", controllerSA, access{verb: "get", resource: "secrets", namespace: "ns", name: "seed"}, false},
	{"controller watches the kubelet's FailedMount Events, to name a missing Secret on its VMI", controllerSA, access{verb: "watch", resource: "events"}, true},
	{"agent may not set a migration's cause", agentSA, access{verb: "set-cause", group: "lifeboat.dev", resource: "virtualmachineinstancemigrations", namespace: "ns"}, false},
	{"controller may not evict pods", controllerSA, access{verb: "create", resource: "pods", subresource: "eviction", namespace: "ns", name: "p"}, false},
	{"controller creates a VM's instance", controllerSA, access{verb: "create", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns"}, true},
	{"controller deletes a VM's ended or halted instance", controllerSA, access{verb: "delete", group: "lifeboat.dev", resource: "virtualmachineinstances", namespace: "ns", name: "vm"}, true},
	{"controller asks who holds a metrics caller's token", controllerSA, access{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"}, true},
	{"controller asks who it is, as it starts (the policies must name it)", controllerSA, access{verb: "create", group: "authentication.k8s.io", resource: "selfsubjectreviews"}, true},
	{"agent asks who it is, as it starts (the policies must name it)", agentSA, access{verb: "create", group: "authentication.k8s.io", resource: "selfsubjectreviews"}, true},
	{"controller watches VMs", controllerSA, access{verb: "watch", group: "lifeboat.dev", resource: "virtualmachines"}, true},
	{"controller sets a VM's finalizer", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachines", namespace: "ns", name: "vm"}, true},
	{"controller writes a VM's status", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "virtualmachines", subresource: "status", namespace: "ns", name: "vm"}, true},
	{"controller may not delete VMs", controllerSA, access{verb: "delete", group: "lifeboat.dev", resource: "virtualmachines", namespace: "ns", name: "vm"}, false},
	{"agent requests its node's migration certificate", agentSA, access{verb: "create", group: "certificates.k8s.io", resource: "certificatesigningrequests"}, true},
	{"agent watches its certificate request until it is signed", agentSA, access{verb: "watch", group: "certificates.k8s.io", resource: "certificatesigningrequests"}, true},
	{"agent may not approve certificate requests", agentSA, access{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", subresource: "approval", name: "csr"}, false},
	{"agent may not sign for lifeboat's signer", agentSA, access{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "lifeboat.dev/migration"}, false},
	{"agent reads the migration CA", agentSA, access{verb: "get", resource: "configmaps", namespace: "lifeboat-system", name: "lifeboat-migration-ca"}, true},
	{"agent may not read the migration CA's key", agentSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "lifeboat-migration-ca"}, false},
	// The signer of node certificates, apart from the controller (manifests/signer.yaml).
	{"signer watches lifeboat's certificate requests", signerSA, access{verb: "watch", group: "certificates.k8s.io", resource: "certificatesigningrequests"}, true},
	{"signer approves lifeboat's certificate requests", signerSA, access{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", subresource: "approval", name: "csr"}, true},
	{"signer writes a certificate", signerSA, access{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", subresource: "status", name: "csr"}, true},
	{"signer approves for lifeboat's signer", signerSA, access{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "lifeboat.dev/migration"}, true},
	{"signer signs for lifeboat's signer", signerSA, access{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "lifeboat.dev/migration"}, true},
	{"signer may not approve kubelet certificates", signerSA, access{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kube-apiserver-client-kubelet"}, false},
	{"signer may not sign kubelet serving certificates", signerSA, access{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kubelet-serving"}, false},
	{"signer reads the migration CA's key", signerSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "lifeboat-migration-ca"}, true},
	{"signer makes the migration CA on first start", signerSA, access{verb: "create", resource: "secrets", namespace: "lifeboat-system"}, true},
	{"signer publishes the migration CA", signerSA, access{verb: "update", resource: "configmaps", namespace: "lifeboat-system", name: "lifeboat-migration-ca"}, true},
	{"signer may not read other Secrets of its namespace", signerSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "other"}, false},
	{"signer may not list Secrets", signerSA, access{verb: "list", resource: "secrets", namespace: "lifeboat-system"}, false},
	{"signer asks the authorizer about a certificate requester", signerSA, access{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"}, true},
	{"signer renews its Lease", signerSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "lifeboat-system", name: "lifeboat-signer"}, true},
	{"signer may not take the controller's Lease", signerSA, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "lifeboat-system", name: "lifeboat-controller"}, false},
	{"signer records an Event on a request", signerSA, access{verb: "create", resource: "events", namespace: "default"}, true},
	{"signer may not read pods", signerSA, access{verb: "list", resource: "pods"}, false},
	{"controller may not approve certificate requests (the signer does)", controllerSA, access{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", subresource: "approval", name: "csr"}, false},
	{"controller may not sign for lifeboat's signer", controllerSA, access{verb: "sign", group: "certificates.k8s.io", resource: "signers", name: "lifeboat.dev/migration"}, false},
	{"controller may not read the migration CA's key", controllerSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "lifeboat-migration-ca"}, false},
	{"controller may not replace the migration CA", controllerSA, access{verb: "update", resource: "configmaps", namespace: "lifeboat-system", name: "lifeboat-migration-ca"}, false},
	{"controller may not create Secrets", controllerSA, access{verb: "create", resource: "secrets", namespace: "lifeboat-system"}, false},
	{"controller may not read other Secrets of its namespace", controllerSA, access{verb: "get", resource: "secrets", namespace: "lifeboat-system", name: "other"}, false},
	{"controller asks the authorizer about a metrics caller", controllerSA, access{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"}, true},
	{"controller may not create VMs", controllerSA, access{verb: "create", group: "lifeboat.dev", resource: "virtualmachines", namespace: "ns"}, false},
	{"controller patches a launcher pod's readiness gate", controllerSA, access{verb: "patch", resource: "pods", subresource: "status", namespace: "ns", name: "p"}, true},
	{"controller may not update a pod's status", controllerSA, access{verb: "update", resource: "pods", subresource: "status", namespace: "ns", name: "p"}, false},
	{"controller may not change the configuration", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "lifeboatconfigs", name: "cluster"}, false},
	// Issue 44: the eviction webhook's ratchet and mode condition.
	{"controller records the webhook's mode in the configuration's status", controllerSA, access{verb: "update", group: "lifeboat.dev", resource: "lifeboatconfigs", subresource: "status", name: "cluster"}, true},
	{"agent may not write the configuration's status (the webhook's ratchet)", agentSA, access{verb: "update", group: "lifeboat.dev", resource: "lifeboatconfigs", subresource: "status", name: "cluster"}, false},
	{"controller may not delete nodes", controllerSA, access{verb: "delete", resource: "nodes", name: "n"}, false},
	// Issue 7: the EvictionRequest responder.
	{"controller watches Evictions", controllerSA, access{verb: "watch", group: "lifecycle.k8s.io", resource: "evictions"}, true},
	{"controller applies its responder status", controllerSA, access{verb: "patch", group: "lifecycle.k8s.io", resource: "evictions", subresource: "status", namespace: "ns", name: "e"}, true},
	{"controller may not replace an Eviction's status", controllerSA, access{verb: "update", group: "lifecycle.k8s.io", resource: "evictions", subresource: "status", namespace: "ns", name: "e"}, false},
	{"controller may not request evictions", controllerSA, access{verb: "create", group: "lifecycle.k8s.io", resource: "evictionrequests", namespace: "ns"}, false},
}

func serviceAccountUser(sa string) (user string, groups []string) {
	return "system:serviceaccount:lifeboat-system:" + sa,
		[]string{"system:serviceaccounts", "system:serviceaccounts:lifeboat-system", "system:authenticated"}
}

func TestRBACAllowsWhatTheCodeDoesAndNoMore(t *testing.T) {
	install(t)
	for _, tc := range rbacCases {
		t.Run(tc.name, func(t *testing.T) {
			user, groups := serviceAccountUser(tc.sa)
			a := tc.access
			review, err := cluster.Kube.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User: user, Groups: groups,
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace, Name: a.name,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if review.Status.Allowed != tc.allowed {
				t.Errorf("%s: %+v allowed = %v, want %v (%s)", tc.sa, a, review.Status.Allowed, tc.allowed, review.Status.Reason)
			}
		})
	}
}
