package check

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"reflect"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/evacuation/placement"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// Names the manifests give lifeboat's parts (manifests/).
const (
	Namespace      = "lifeboat-system"
	ControllerName = "lifeboat-controller"
	AgentName      = "lifeboat-agent"
	// LeaseName is the controller's leader-election Lease, in Namespace.
	LeaseName = "lifeboat-controller"
)

const installFix = "install lifeboat: kubectl apply --server-side -k manifests/ (docs/configuration.md, \"Installing\")"

// CRD checks one of lifeboat's CRDs (nil: not installed) against the Go type of its kind, which
// this binary and the controllers built with it read and write.
func CRD(name string, crd *apiextensionsv1.CustomResourceDefinition, want reflect.Type) Result {
	r := Result{Check: "CRD " + name}
	if crd == nil {
		r.Status, r.Message, r.Fix = Fail, "not installed", installFix
		return r
	}
	established := false
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			established = true
		}
	}
	if !established {
		r.Status, r.Message, r.Fix = Fail, "not established: the API server does not serve it", "kubectl describe crd "+name
		return r
	}
	var version *apiextensionsv1.CustomResourceDefinitionVersion
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Name == v1alpha1.SchemeGroupVersion.Version && crd.Spec.Versions[i].Served {
			version = &crd.Spec.Versions[i]
		}
	}
	if version == nil || version.Schema == nil {
		r.Status, r.Message, r.Fix = Fail, fmt.Sprintf("version %s is not served", v1alpha1.SchemeGroupVersion.Version),
			"apply the CRDs of this release: kubectl apply --server-side -f manifests/crds/"
		return r
	}
	missing, extra := SchemaDiff(version.Schema.OpenAPIV3Schema, want)
	switch {
	case len(missing) > 0:
		r.Status = Fail
		r.Message = fmt.Sprintf("older than this kubectl-lifeboat: the served %s schema lacks %s, which the API server would drop",
			version.Name, strings.Join(missing, ", "))
		r.Fix = "apply the CRDs of the release you run: kubectl apply --server-side -f manifests/crds/"
	case len(extra) > 0:
		r.Status = Warn
		r.Message = fmt.Sprintf("newer than this kubectl-lifeboat: the served %s schema has %s, which it does not know",
			version.Name, strings.Join(extra, ", "))
		r.Fix = "use the kubectl-lifeboat of the release installed"
	default:
		r.Status, r.Message = OK, fmt.Sprintf("%s served, its schema as this kubectl-lifeboat expects", version.Name)
	}
	return r
}

// Config checks that the LifeboatConfig exists (nil: it does not).
func Config(config *v1alpha1.LifeboatConfig) Result {
	r := Result{Check: "LifeboatConfig"}
	if config == nil {
		r.Status, r.Message = Warn, "no LifeboatConfig "+v1alpha1.ConfigName+": VMs get eviction strategy None and node-pressure eviction shuts them down"
		r.Fix = "kubectl apply --server-side -f manifests/lifeboatconfig.yaml (docs/configuration.md)"
		return r
	}
	strategy := "None"
	if s := config.Spec.EvictionStrategy; s != nil {
		strategy = string(*s)
	}
	gates := "none"
	if len(config.Spec.FeatureGates) > 0 {
		gates = fmt.Sprint(config.Spec.FeatureGates)
	}
	r.Status, r.Message = OK, fmt.Sprintf("default eviction strategy %s, feature gates %s", strategy, gates)
	return r
}

// Controller checks that a controller replica leads (its Lease held and renewed) and how the
// Deployment stands (nil: no such Deployment, as where the controller runs outside the cluster).
func Controller(lease *coordinationv1.Lease, deployment *appsv1.Deployment, now time.Time) Result {
	r := Result{Check: "controller"}
	logs := fmt.Sprintf("kubectl -n %s logs deploy/%s", Namespace, ControllerName)
	replicas, short := "", false
	if deployment != nil {
		want := int32(1)
		if deployment.Spec.Replicas != nil {
			want = *deployment.Spec.Replicas
		}
		replicas = fmt.Sprintf("Deployment %s/%s: %d of %d replicas available", Namespace, ControllerName, deployment.Status.AvailableReplicas, want)
		short = deployment.Status.AvailableReplicas < want
	}
	if holder, renewed, ok := leading(lease, now); ok {
		r.Status = OK
		r.Message = fmt.Sprintf("%s leads (Lease %s/%s renewed %s ago)", holder, Namespace, LeaseName, now.Sub(renewed).Truncate(time.Second))
		switch {
		case replicas == "":
			r.Message += fmt.Sprintf("; no Deployment %s/%s: it runs outside the cluster", Namespace, ControllerName)
		case short:
			// Every replica serves the webhook: fewer of them, less room when one fails.
			r.Status, r.Message = Warn, r.Message+"; "+replicas
			r.Fix = fmt.Sprintf("kubectl -n %s describe deploy/%s", Namespace, ControllerName)
		default:
			r.Message += "; " + replicas
		}
		return r
	}
	r.Status = Fail
	switch {
	case deployment == nil:
		r.Message, r.Fix = fmt.Sprintf("not installed: no Deployment %s/%s and no replica leads", Namespace, ControllerName), installFix
	case deployment.Status.AvailableReplicas == 0:
		r.Message = replicas + ": no migration, evacuation or VM starts until one runs"
		r.Fix = fmt.Sprintf("kubectl -n %s describe deploy/%s; %s", Namespace, ControllerName, logs)
	default:
		r.Message = replicas + fmt.Sprintf(", but none holds the Lease %s/%s: the controllers run in the leader only", Namespace, LeaseName)
		r.Fix = logs + " (each replica needs --leader-elect and the right to write Leases in " + Namespace + ")"
	}
	return r
}

// SignerName is the Deployment of the signer of node certificates (manifests/signer.yaml).
const SignerName = "lifeboat-signer"

// ControlNodes checks that some node runs no VMs: the controller's and the signer's Deployments
// keep off nodes labelled lifeboat.dev/kvm=true (required node affinity), since root on such a
// node can read the tokens of the pods there.
func ControlNodes(nodes []corev1.Node) Result {
	r := Result{Check: "controller nodes"}
	var free []string
	for _, n := range nodes {
		if n.Labels[v1alpha1.LabelKVMNode] != "true" {
			free = append(free, n.Name)
		}
	}
	if len(free) == 0 {
		r.Status = Fail
		r.Message = fmt.Sprintf("every node (%d) is labelled %s=true: the Deployments %s/%s and %s/%s keep off VM nodes and have nowhere to run",
			len(nodes), v1alpha1.LabelKVMNode, Namespace, ControllerName, Namespace, SignerName)
		r.Fix = "give them a node that runs no VMs (a control-plane node, with a toleration of its taint added by a kustomize overlay), " +
			"or remove their nodeAffinity in an overlay, accepting that root on a VM node can then take their tokens (docs/operations.md, \"The controller's nodes\")"
		return r
	}
	r.Status = OK
	r.Message = fmt.Sprintf("%d node(s) not labelled %s=true for the controller and the signer: %s", len(free), v1alpha1.LabelKVMNode, strings.Join(free[:min(len(free), 5)], ", "))
	return r
}

// Outside says whether the controller runs outside the cluster: a replica leads, and there is
// no Deployment.
func Outside(lease *coordinationv1.Lease, deployment *appsv1.Deployment, now time.Time) bool {
	_, _, ok := leading(lease, now)
	return ok && deployment == nil
}

// leading is the Lease's holder and last renewal, and whether its term still runs at now.
func leading(lease *coordinationv1.Lease, now time.Time) (string, time.Time, bool) {
	if lease == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" || lease.Spec.RenewTime == nil {
		return "", time.Time{}, false
	}
	term := 15 * time.Second
	if d := lease.Spec.LeaseDurationSeconds; d != nil {
		term = time.Duration(*d) * time.Second
	}
	renewed := lease.Spec.RenewTime.Time
	return *lease.Spec.HolderIdentity, renewed, now.Before(renewed.Add(term))
}

// Webhook checks the eviction webhook's registration (nil: none) and, for a Service, how many
// ready endpoints it has (nil: the Service does not exist).
func Webhook(config *admissionregistrationv1.ValidatingWebhookConfiguration, webhookName string, readyEndpoints *int) Result {
	r := Result{Check: "eviction webhook"}
	logs := fmt.Sprintf("kubectl -n %s logs deploy/%s", Namespace, ControllerName)
	var hook *admissionregistrationv1.ValidatingWebhook
	if config != nil {
		for i := range config.Webhooks {
			if config.Webhooks[i].Name == webhookName {
				hook = &config.Webhooks[i]
			}
		}
	}
	const blind = "evictions of VM pods (drains, the descheduler) reach only their disruption budgets and wait"
	switch {
	case hook == nil:
		r.Status, r.Message = Fail, "not registered: "+blind
		r.Fix = "the controller registers it at start with --webhook-listen (manifests/controller.yaml); " + logs
	case len(hook.ClientConfig.CABundle) == 0:
		r.Status, r.Message, r.Fix = Fail, "registered without a CA bundle: the API server cannot verify it, and "+blind, logs
	case hook.ClientConfig.URL != nil:
		r.Status = OK
		r.Message = fmt.Sprintf("registered at %s, which the API server calls directly (not checked from here)", *hook.ClientConfig.URL)
	case hook.ClientConfig.Service == nil:
		r.Status, r.Message, r.Fix = Fail, "registered with neither a URL nor a Service", logs
	default:
		svc := hook.ClientConfig.Service.Namespace + "/" + hook.ClientConfig.Service.Name
		switch {
		case readyEndpoints == nil:
			r.Status, r.Message, r.Fix = Fail, fmt.Sprintf("its Service %s does not exist: %s", svc, blind), installFix
		case *readyEndpoints == 0:
			r.Status = Fail
			r.Message = fmt.Sprintf("its Service %s has no ready endpoint: the API server cannot reach it, and %s", svc, blind)
			r.Fix = fmt.Sprintf("kubectl -n %s get endpointslices -l kubernetes.io/service-name=%s; the controller's pods must be Ready (%s)",
				hook.ClientConfig.Service.Namespace, hook.ClientConfig.Service.Name, logs)
		default:
			r.Status, r.Message = OK, fmt.Sprintf("registered, its Service %s has %d ready endpoint(s)", svc, *readyEndpoints)
		}
	}
	return r
}

// WebhookAuthentication says whether the API server authenticates to the webhook, from the
// LifeboatConfig's condition (nil: not recorded).
func WebhookAuthentication(c *metav1.Condition) Result {
	r := Result{Check: "webhook authentication"}
	fix := "give the API server a client certificate for webhooks (docs/operations.md, \"The eviction webhook\")"
	switch {
	case c == nil:
		r.Status = Unknown
		r.Message = "not recorded: the controller writes no " + v1alpha1.ConfigConditionEvictionWebhookStrict + " condition on the LifeboatConfig, and the API server does not say which client certificate it presents to webhooks"
		r.Fix = "if drains of VM nodes hang, see docs/operations.md, \"The eviction webhook\""
	case c.Status == metav1.ConditionTrue:
		r.Status, r.Message = OK, fmt.Sprintf("the API server authenticates (%s): %s", c.Reason, c.Message)
	default:
		r.Status, r.Message, r.Fix = Warn, fmt.Sprintf("the API server has not authenticated to it (%s): %s", c.Reason, c.Message), fix
	}
	return r
}

// Agents checks that every node that may run VMs (labelled lifeboat.dev/kvm=true, as launcher
// pods select) and every node that runs VMs has a ready agent pod. daemonSet is nil when the
// agents' DaemonSet does not exist; agentPods are its pods. outside says that the controller
// runs outside the cluster (it leads without a Deployment), as in make demo's and the tests'
// clusters: there agents without a DaemonSet are processes the API server does not show.
func Agents(nodes []corev1.Node, daemonSet *appsv1.DaemonSet, agentPods []corev1.Pod, vmis []v1alpha1.VirtualMachineInstance, outside bool) []Result {
	switch {
	case daemonSet == nil && outside:
		return []Result{{Check: "agents", Status: Unknown,
			Message: fmt.Sprintf("no DaemonSet %s/%s, and the controller runs outside the cluster: agents that run outside it too are not seen from the API", Namespace, AgentName),
			Fix:     "on a cluster of your own, " + installFix}}
	case daemonSet == nil:
		return []Result{{Check: "agents", Status: Fail, Message: fmt.Sprintf("no DaemonSet %s/%s: no node can run VMs", Namespace, AgentName), Fix: installFix}}
	}
	ready := map[string]bool{}
	for i := range agentPods {
		p := &agentPods[i]
		if p.DeletionTimestamp == nil && podReady(p) {
			ready[p.Spec.NodeName] = true
		}
	}
	vmsOn := vmsByNode(vmis)
	var out []Result
	kvm := 0
	for _, n := range nodes {
		isKVM := n.Labels[v1alpha1.LabelKVMNode] == "true"
		if isKVM {
			kvm++
		}
		vms := vmsOn[n.Name]
		if (!isKVM && len(vms) == 0) || ready[n.Name] {
			continue
		}
		r := Result{Check: "agent on node " + n.Name, Status: Fail,
			Fix: fmt.Sprintf("kubectl -n %s get pods -l app.kubernetes.io/name=%s -o wide --field-selector spec.nodeName=%s", Namespace, AgentName, n.Name)}
		if len(vms) > 0 {
			r.Message = fmt.Sprintf("no ready agent, yet %d VM(s) run there (%s): nothing migrates them when the node must give them up", len(vms), names(vms, 3))
		} else {
			r.Message = "no ready agent: VMs scheduled there will not start"
		}
		if !isKVM {
			r.Message += fmt.Sprintf("; the node is not labelled %s=true", v1alpha1.LabelKVMNode)
		}
		out = append(out, r)
	}
	if kvm == 0 {
		out = append(out, Result{Check: "agents", Status: Warn, Message: fmt.Sprintf("no node is labelled %s=true: no VM can be scheduled", v1alpha1.LabelKVMNode),
			Fix: fmt.Sprintf("kubectl label node NODE %s=true for each node with KVM", v1alpha1.LabelKVMNode)})
	}
	if len(out) == 0 {
		out = append(out, Result{Check: "agents", Status: OK, Message: fmt.Sprintf("ready on all %d VM node(s)", kvm)})
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// active says whether a VMI has a guest that may run on a node (it is neither ended nor waiting
// for a node).
func active(v *v1alpha1.VirtualMachineInstance) bool {
	return v.Status.NodeName != "" && v.Status.Phase != v1alpha1.VMISucceeded && v.Status.Phase != v1alpha1.VMIFailed
}

func vmsByNode(vmis []v1alpha1.VirtualMachineInstance) map[string][]*v1alpha1.VirtualMachineInstance {
	out := map[string][]*v1alpha1.VirtualMachineInstance{}
	for i := range vmis {
		if v := &vmis[i]; active(v) {
			out[v.Status.NodeName] = append(out[v.Status.NodeName], v)
		}
	}
	return out
}

func names(vms []*v1alpha1.VirtualMachineInstance, most int) string {
	var s []string
	for _, v := range vms[:min(len(vms), most)] {
		s = append(s, v.Namespace+"/"+v.Name)
	}
	if len(vms) > most {
		s = append(s, fmt.Sprintf("and %d more", len(vms)-most))
	}
	return strings.Join(s, ", ")
}

// KubeletEviction is what a node's kubelet does under memory pressure, from its configuration.
type KubeletEviction struct {
	// SoftMemory and HardMemory are its memory.available thresholds, "" where it has none.
	SoftMemory, HardMemory string
	// MaxPodGracePeriod is evictionMaxPodGracePeriod, in seconds.
	MaxPodGracePeriod int64
}

// Protection is what lifeboat does about node pressure, from the LifeboatConfig.
type Protection struct {
	// Gate is NodePressureEvictionLiveMigration: without it a node-pressure eviction shuts the VM down.
	Gate bool
	// Relief moves VMs before the kubelet has to evict; Margin is its distance above the threshold.
	Relief bool
	Margin string
	// Bandwidth is spec.migrations.bandwidthPerMigration in bytes per second; 0 means no cap.
	Bandwidth int64
}

// ProtectionOf reads the protection a LifeboatConfig (nil: none) gives.
func ProtectionOf(config *v1alpha1.LifeboatConfig) Protection {
	// Relief left unset is on wherever the kubelet's grace is too short for a migration, which is
	// every node where this check would need it.
	p := Protection{Gate: v1alpha1.FeatureGateEnabled(config, v1alpha1.FeatureGateNodePressureEvictionLiveMigration), Margin: "512Mi", Relief: true}
	if config == nil {
		return p
	}
	if r := config.Spec.NodePressureRelief; r != nil {
		if r.Enabled != nil {
			p.Relief = *r.Enabled
		}
		if r.Margin != nil {
			p.Margin = r.Margin.String()
		}
	}
	if b := config.Spec.Migrations.BandwidthPerMigration; b != nil {
		p.Bandwidth = b.Value()
	}
	return p
}

// SoftEvictionGrace is the grace period the kubelet gives a pod on soft eviction:
// min(evictionMaxPodGracePeriod, the pod's), never below its minimum of one second.
func SoftEvictionGrace(maxPodGracePeriod, podGracePeriod int64) int64 {
	return max(1, min(maxPodGracePeriod, podGracePeriod))
}

// NodeEviction says what the node's kubelet (nil: its configuration is not served, for why)
// gives the VMs on it under memory pressure, and whether the largest of them could migrate in
// that time at the configured bandwidth.
func NodeEviction(node string, kubelet *KubeletEviction, why string, vms []*v1alpha1.VirtualMachineInstance, p Protection) Result {
	r := Result{Check: "node " + node + " eviction"}
	relief := "relief off"
	if p.Relief {
		relief = "relief on (margin " + p.Margin + ")"
	}
	if kubelet == nil {
		r.Status = Unknown
		r.Message = fmt.Sprintf("the kubelet's configuration is not served through the API server (%s); %s", why, relief)
		r.Fix = "read the node's kubelet configuration (/var/lib/kubelet/config.yaml): evictionSoft memory.available with evictionMaxPodGracePeriod above a VM's migration time (manifests/examples/kubelet-config.yaml)"
		return r
	}
	if !p.Gate {
		r.Status = Warn
		r.Message = fmt.Sprintf("feature gate %s is off: a node-pressure eviction shuts VMs down instead of migrating them; %s", v1alpha1.FeatureGateNodePressureEvictionLiveMigration, relief)
		r.Fix = fmt.Sprintf("add %s to the LifeboatConfig's spec.featureGates", v1alpha1.FeatureGateNodePressureEvictionLiveMigration)
		return r
	}
	if kubelet.SoftMemory == "" {
		hard := "no hard threshold"
		if kubelet.HardMemory != "" {
			hard = "hard memory.available<" + kubelet.HardMemory
		}
		r.Message = fmt.Sprintf("no soft memory.available threshold: at its %s the kubelet kills a VM pod with no grace (1s), too soon to migrate; %s", hard, relief)
		r.Fix = "give the kubelet evictionSoft memory.available above evictionHard, with evictionSoftGracePeriod and evictionMaxPodGracePeriod (manifests/examples/kubelet-config.yaml)"
		r.Status = Warn
		if p.Relief {
			r.Status, r.Message = OK, r.Message+": relief moves VMs before the threshold"
		}
		return r
	}
	r.Message = fmt.Sprintf("soft memory.available<%s, evictionMaxPodGracePeriod %ds", kubelet.SoftMemory, kubelet.MaxPodGracePeriod)
	var largest *v1alpha1.VirtualMachineInstance
	for _, v := range vms {
		if largest == nil || v.Spec.Memory.Cmp(largest.Spec.Memory) > 0 {
			largest = v
		}
	}
	if largest == nil {
		r.Status, r.Message = OK, r.Message+fmt.Sprintf(": a VM pod gets up to %ds; no VM runs there; %s", kubelet.MaxPodGracePeriod, relief)
		return r
	}
	grace := SoftEvictionGrace(kubelet.MaxPodGracePeriod, vmi.PodGracePeriodSeconds(largest))
	r.Message += fmt.Sprintf(": the largest VM there, %s/%s (%s), gets %ds", largest.Namespace, largest.Name, largest.Spec.Memory.String(), grace)
	if p.Bandwidth <= 0 {
		r.Status = OK
		r.Message += fmt.Sprintf(" (migrations have no bandwidth cap: its migration time is not estimated); %s", relief)
		return r
	}
	need := migrationSeconds(largest.Spec.Memory, p.Bandwidth)
	bw := resource.NewQuantity(p.Bandwidth, resource.BinarySI).String()
	if need > grace {
		r.Status = Fail
		r.Message += fmt.Sprintf(", but copying its memory once takes %ds at bandwidthPerMigration %s/s: it would be lost; %s", need, bw, relief)
		r.Fix = fmt.Sprintf("raise the kubelet's evictionMaxPodGracePeriod (and the VM's terminationGracePeriodSeconds) above %ds, or spec.migrations.bandwidthPerMigration", need)
		return r
	}
	r.Status = OK
	r.Message += fmt.Sprintf(", and copying its memory once takes %ds at bandwidthPerMigration %s/s; %s", need, bw, relief)
	return r
}

// migrationSeconds is the time one copy of memory takes at bandwidth bytes per second, rounded up.
func migrationSeconds(memory resource.Quantity, bandwidth int64) int64 {
	return (memory.Value() + bandwidth - 1) / bandwidth
}

// NodeCertificates checks each VM node's newest migration certificate request (signer
// lifeboat.dev/migration): issued and far from expiry, or what is wrong.
func NodeCertificates(nodes []string, csrs []certificatesv1.CertificateSigningRequest, now time.Time) []Result {
	newest := map[string]*certificatesv1.CertificateSigningRequest{}
	for i := range csrs {
		c := &csrs[i]
		if c.Spec.SignerName != migrationtls.SignerName {
			continue
		}
		node := csrNode(c)
		if old := newest[node]; old == nil || old.CreationTimestamp.Before(&c.CreationTimestamp) {
			newest[node] = c
		}
	}
	fix := func(node string) string {
		return fmt.Sprintf("kubectl get csr --field-selector spec.signerName=%s; the agent's log on node %s (kubectl -n %s logs -l app.kubernetes.io/name=%s)",
			migrationtls.SignerName, node, Namespace, AgentName)
	}
	var out []Result
	var unseen []string
	for _, node := range nodes {
		c := newest[node]
		if c == nil {
			unseen = append(unseen, node)
			continue
		}
		r := Result{Check: "node " + node + " certificate", Fix: fix(node)}
		if cond := csrFailure(c); cond != nil {
			r.Status, r.Message = Fail, fmt.Sprintf("request %s %s (%s): %s; the node's migrations fail", c.Name, cond.Type, cond.Reason, cond.Message)
			out = append(out, r)
			continue
		}
		cert := parseCertificate(c.Status.Certificate)
		switch {
		case cert == nil && now.Sub(c.CreationTimestamp.Time) > 5*time.Minute:
			r.Status, r.Message = Warn, fmt.Sprintf("request %s is still pending after %s: is the signer (Deployment %s/%s) running?", c.Name, now.Sub(c.CreationTimestamp.Time).Truncate(time.Second), Namespace, SignerName)
		case cert == nil:
			continue
		case !now.Before(cert.NotAfter):
			r.Status, r.Message = Fail, fmt.Sprintf("expired at %s: migrations to and from the node fail", cert.NotAfter.UTC().Format(time.RFC3339))
		case cert.NotAfter.Sub(now) < cert.NotAfter.Sub(cert.NotBefore)/10:
			r.Status, r.Message = Warn, fmt.Sprintf("expires at %s and is not renewed (the agent renews at 70 to 90%% of its life)", cert.NotAfter.UTC().Format(time.RFC3339))
		default:
			continue
		}
		out = append(out, r)
	}
	if len(unseen) > 0 {
		out = append(out, Result{Check: "node certificates", Status: Unknown,
			Message: fmt.Sprintf("no migration certificate request listed for %d node(s) (%s): kube-controller-manager deletes issued requests after an hour", len(unseen), strings.Join(unseen[:min(len(unseen), 5)], ", ")),
			Fix:     "the agents' metric lifeboat_agent_migration_certificate_renewal_failures_total says whether renewals fail"})
	}
	if len(out) == 0 {
		out = append(out, Result{Check: "node certificates", Status: OK, Message: fmt.Sprintf("valid on all %d VM node(s)", len(nodes))})
	}
	return out
}

// csrNode is the node a migration certificate request is for, from its subject's common name.
func csrNode(c *certificatesv1.CertificateSigningRequest) string {
	block, _ := pem.Decode(c.Spec.Request)
	if block == nil {
		return ""
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return ""
	}
	node, _ := strings.CutPrefix(req.Subject.CommonName, migrationtls.CommonName(""))
	return node
}

func csrFailure(c *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	for i, cond := range c.Status.Conditions {
		if (cond.Type == certificatesv1.CertificateDenied || cond.Type == certificatesv1.CertificateFailed) && cond.Status == corev1.ConditionTrue {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

func parseCertificate(data []byte) *x509.Certificate {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return cert
}

// LabelPodSecurityEnforce is the namespace label with the Pod Security level the API server enforces.
const LabelPodSecurityEnforce = "pod-security.kubernetes.io/enforce"

// PodSecurity checks the namespaces that hold VMs: launcher pods meet Pod Security
// "restricted", so a VM namespace can enforce it and keep privileged pods away from the VMs.
// A namespace whose VMs boot from node paths needs hostPath volumes, which only "privileged" admits.
func PodSecurity(namespaces []corev1.Namespace, vmis []v1alpha1.VirtualMachineInstance) []Result {
	nodePaths := map[string]bool{}
	holds := map[string]bool{}
	for i := range vmis {
		holds[vmis[i].Namespace] = true
		if len(v1alpha1.NodePaths(vmis[i].Spec.Boot)) > 0 {
			nodePaths[vmis[i].Namespace] = true
		}
	}
	var out []Result
	restricted := 0
	for _, ns := range namespaces {
		if !holds[ns.Name] {
			continue
		}
		level := ns.Labels[LabelPodSecurityEnforce]
		switch {
		case level == "restricted":
			restricted++
			continue
		case nodePaths[ns.Name]:
			continue
		}
		shown := level
		if shown == "" {
			shown = "none (the cluster's default)"
		}
		out = append(out, Result{Check: "namespace " + ns.Name + " Pod Security", Status: Warn,
			Message: fmt.Sprintf("holds VMs but enforces %s, not restricted: pods beside the VMs may be privileged", shown),
			Fix:     fmt.Sprintf("kubectl label namespace %s %s=restricted (launcher pods meet it; manifests/examples/vm-namespace.yaml)", ns.Name, LabelPodSecurityEnforce)})
	}
	if len(out) == 0 {
		out = append(out, Result{Check: "VM namespaces' Pod Security", Status: OK,
			Message: fmt.Sprintf("%d of %d VM namespace(s) enforce restricted; the others' VMs boot from node paths", restricted, len(holds))})
		if restricted == len(holds) {
			out[0].Message = fmt.Sprintf("all %d VM namespace(s) enforce restricted", restricted)
		}
	}
	return out
}

// Migratable finds the running VMs that cannot live-migrate: their LiveMigratable condition is
// False, or their nodeSelector matches no other node that may run VMs. Such a VM with eviction
// strategy LiveMigrate fails the check: its node cannot be drained.
func Migratable(vmis []v1alpha1.VirtualMachineInstance, nodes []corev1.Node, config *v1alpha1.LifeboatConfig) []Result {
	var out []Result
	running := 0
	for i := range vmis {
		v := &vmis[i]
		if !active(v) {
			continue
		}
		running++
		var why []string
		if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c != nil && c.Status == metav1.ConditionFalse {
			why = append(why, fmt.Sprintf("%s: %s", c.Reason, c.Message))
		}
		if _, pinned := otherNodes(v, nodes); pinned != "" && !noTargetCondition(v) {
			why = append(why, "pinned: "+pinned)
		}
		if len(why) == 0 {
			continue
		}
		strategy := v1alpha1.EffectiveEvictionStrategy(v, config)
		r := Result{Check: "VM " + v.Namespace + "/" + v.Name, Status: Warn,
			Message: fmt.Sprintf("on node %s cannot live-migrate (%s); eviction strategy %s", v.Status.NodeName, strings.Join(why, "; "), strategy),
			Fix:     "widen its nodeSelector, make another node able to take it, or make it migratable; kubectl lifeboat status " + v.Name + " -n " + v.Namespace}
		switch strategy {
		case v1alpha1.EvictionStrategyLiveMigrate:
			r.Status = Fail
			r.Message += ": a drain of its node waits for ever"
		case v1alpha1.EvictionStrategyNone:
			r.Message += ": it shuts down when its node must give it up"
		default:
			r.Message += ": it shuts down instead of migrating"
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		out = append(out, Result{Check: "VMs", Status: OK, Message: fmt.Sprintf("all %d running VM(s) can live-migrate", running)})
	}
	return out
}

// otherNodes are the nodes other than v's own that could take its target pod (placement.TargetNodes), and
// if none, why not.
func otherNodes(v *v1alpha1.VirtualMachineInstance, nodes []corev1.Node) ([]string, string) {
	return placement.TargetNodes(vmi.TargetPlacement(v), v.Status.NodeName, pointers(nodes))
}

// noTargetCondition: the VMI's LiveMigratable condition already says that no node can take it.
func noTargetCondition(v *v1alpha1.VirtualMachineInstance) bool {
	c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.VMIReasonNoTargetNode
}

// Stuck finds the migrations that have not ended within after of their creation.
func Stuck(migrations []v1alpha1.VirtualMachineInstanceMigration, after time.Duration, now time.Time) []Result {
	var out []Result
	inFlight := 0
	for i := range migrations {
		m := &migrations[i]
		if m.Status.Phase == v1alpha1.MigrationSucceeded || m.Status.Phase == v1alpha1.MigrationFailed {
			continue
		}
		inFlight++
		age := now.Sub(m.CreationTimestamp.Time)
		if age < after {
			continue
		}
		phase := string(m.Status.Phase)
		if phase == "" {
			phase = "not yet picked up by the controller"
		}
		out = append(out, Result{Check: "migration " + m.Namespace + "/" + m.Name, Status: Fail,
			Message: fmt.Sprintf("of VMI %s still %s after %s", m.Spec.VMIName, phase, age.Truncate(time.Second)),
			Fix: fmt.Sprintf("kubectl describe vmim %s -n %s; kubectl lifeboat status %s -n %s; delete the migration to give up",
				m.Name, m.Namespace, m.Spec.VMIName, m.Namespace)})
	}
	if len(out) == 0 {
		out = append(out, Result{Check: "migrations", Status: OK, Message: fmt.Sprintf("%d in flight, none older than %s", inFlight, after)})
	}
	return out
}
