package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// Clients reach the API server as the admin running the check.
type Clients struct {
	Kube       kubernetes.Interface
	Lifeboat   lifeboatclient.Interface
	Extensions apiextensions.Interface
}

// Options tune the checks.
type Options struct {
	// StuckAfter is how long a migration may run before it counts as stuck.
	StuckAfter time.Duration
	// NodeTimeout bounds each node's configz read through the API server.
	NodeTimeout time.Duration
	// Namespace, if set, limits the checks of VMs, their namespaces and migrations to it.
	Namespace string
}

// CRDs are lifeboat's CRDs and the Go type of each one's kind.
var CRDs = []struct {
	Name string
	Type reflect.Type
}{
	{"virtualmachineinstances." + v1alpha1.GroupName, reflect.TypeFor[v1alpha1.VirtualMachineInstance]()},
	{"virtualmachineinstancemigrations." + v1alpha1.GroupName, reflect.TypeFor[v1alpha1.VirtualMachineInstanceMigration]()},
	{"virtualmachines." + v1alpha1.GroupName, reflect.TypeFor[v1alpha1.VirtualMachine]()},
	{"lifeboatconfigs." + v1alpha1.GroupName, reflect.TypeFor[v1alpha1.LifeboatConfig]()},
}

// Run reads the cluster and checks it. It fails only when the API server cannot be reached;
// a read the caller may not make, or that fails, is a line of its own.
func Run(ctx context.Context, c Clients, o Options, now time.Time) (Report, error) {
	if _, err := c.Kube.Discovery().ServerVersion(); err != nil {
		return Report{}, fmt.Errorf("reaching the API server: %w", err)
	}
	var rep Report
	add := func(rs ...Result) { rep.Results = append(rep.Results, rs...) }

	crdsServed := true
	for _, crd := range CRDs {
		got, err := c.Extensions.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			got = nil
		case err != nil:
			add(unreadable("CRD "+crd.Name, "the CRD", err))
			crdsServed = false
			continue
		}
		r := CRD(crd.Name, got, crd.Type)
		crdsServed = crdsServed && got != nil && r.Status != Fail
		add(r)
	}

	config, strict, err := readConfig(ctx, c.Lifeboat)
	if err != nil {
		add(unreadable("LifeboatConfig", "LifeboatConfig "+v1alpha1.ConfigName, err))
	} else {
		add(Config(config))
	}

	lease, err := Optional(c.Kube.CoordinationV1().Leases(Namespace).Get(ctx, LeaseName, metav1.GetOptions{}))
	deployment, err2 := Optional(c.Kube.AppsV1().Deployments(Namespace).Get(ctx, ControllerName, metav1.GetOptions{}))
	outside := false
	if err = firstError(err, err2); err != nil {
		add(unreadable("controller", "the controller's Lease and Deployment", err))
	} else {
		add(Controller(lease, deployment, now))
		outside = Outside(lease, deployment, now)
	}

	add(checkWebhook(ctx, c.Kube))
	add(WebhookAuthentication(strict))

	nodeList, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		add(unreadable("nodes", "the nodes", err))
		return rep, nil
	}
	nodes := nodeList.Items
	var vmis []v1alpha1.VirtualMachineInstance
	if crdsServed {
		list, err := c.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(o.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			add(unreadable("VMs", "the VMIs", err))
		} else {
			vmis = list.Items
		}
	}

	// Only the Deployments keep off VM nodes; a controller run elsewhere is placed by its owner.
	if deployment != nil {
		add(ControlNodes(nodes))
	}
	add(checkAgents(ctx, c.Kube, nodes, vmis, outside)...)

	vmsOn := vmsByNode(vmis)
	var vmNodes []string
	for _, n := range nodes {
		if n.Labels[v1alpha1.LabelKVMNode] == "true" || len(vmsOn[n.Name]) > 0 {
			vmNodes = append(vmNodes, n.Name)
		}
	}
	protection := ProtectionOf(config)
	for i, kubelet := range kubeletEvictions(ctx, c.Kube, vmNodes, o.NodeTimeout) {
		add(NodeEviction(vmNodes[i], kubelet.settings, kubelet.why, vmsOn[vmNodes[i]], protection))
	}

	csrs, err := c.Kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + migrationtls.SignerName})
	if err != nil {
		add(unreadable("node certificates", "certificate signing requests", err))
	} else {
		add(NodeCertificates(vmNodes, csrs.Items, now)...)
	}

	if !crdsServed {
		return rep, nil
	}
	var listNamespaces metav1.ListOptions
	if o.Namespace != "" {
		listNamespaces.FieldSelector = "metadata.name=" + o.Namespace
	}
	namespaces, err := c.Kube.CoreV1().Namespaces().List(ctx, listNamespaces)
	if err != nil {
		add(unreadable("VM namespaces' Pod Security", "the namespaces", err))
	} else {
		add(PodSecurity(namespaces.Items, vmis)...)
	}
	add(Migratable(vmis, nodes, config)...)
	migrations, err := c.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		add(unreadable("migrations", "the migrations", err))
	} else {
		add(Stuck(migrations.Items, o.StuckAfter, now)...)
	}
	return rep, nil
}

// unreadable is the line of a check whose objects could not be read.
func unreadable(check, what string, err error) Result {
	r := Result{Check: check, Status: Unknown, Message: fmt.Sprintf("cannot read %s: %v", what, err)}
	if apierrors.IsForbidden(err) {
		r.Fix = "run the check as a cluster admin (it reads cluster-wide objects)"
	}
	return r
}

// Optional turns a read's NotFound into a nil object: for what a cluster may lack.
func Optional[T any](obj *T, err error) (*T, error) {
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return obj, nil
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// readConfig reads the LifeboatConfig (nil if there is none) and its EvictionWebhookStrict
// condition (nil if not recorded), from its JSON: controllers that predate the condition
// write no status, and this binary's type may have none.
func readConfig(ctx context.Context, lb lifeboatclient.Interface) (*v1alpha1.LifeboatConfig, *metav1.Condition, error) {
	raw, err := lb.LifeboatV1alpha1().RESTClient().Get().Resource("lifeboatconfigs").Name(v1alpha1.ConfigName).DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var config v1alpha1.LifeboatConfig
	if err := json.Unmarshal(raw, &config); err != nil {
		return nil, nil, err
	}
	return &config, meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionEvictionWebhookStrict), nil
}

func checkWebhook(ctx context.Context, kube kubernetes.Interface) Result {
	const check = "eviction webhook"
	config, err := Optional(kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{}))
	if err != nil {
		return unreadable(check, "ValidatingWebhookConfiguration "+webhook.ConfigurationName, err)
	}
	var ready *int
	if config != nil {
		for _, w := range config.Webhooks {
			if w.Name != webhook.WebhookName || w.ClientConfig.Service == nil {
				continue
			}
			svc := w.ClientConfig.Service
			if ready, err = readyEndpoints(ctx, kube, svc.Namespace, svc.Name); err != nil {
				return unreadable(check, "the webhook's Service "+svc.Namespace+"/"+svc.Name, err)
			}
		}
	}
	return Webhook(config, webhook.WebhookName, ready)
}

// readyEndpoints counts the Service's ready endpoints; nil if the Service does not exist.
func readyEndpoints(ctx context.Context, kube kubernetes.Interface, namespace, name string) (*int, error) {
	svc, err := Optional(kube.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{}))
	if err != nil || svc == nil {
		return nil, err
	}
	slices, err := kube.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, err
	}
	n := 0
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			// Unset means ready (the API's own reading).
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				n++
			}
		}
	}
	return &n, nil
}

func checkAgents(ctx context.Context, kube kubernetes.Interface, nodes []corev1.Node, vmis []v1alpha1.VirtualMachineInstance, outside bool) []Result {
	ds, err := Optional(kube.AppsV1().DaemonSets(Namespace).Get(ctx, AgentName, metav1.GetOptions{}))
	if err != nil {
		return []Result{unreadable("agents", "DaemonSet "+Namespace+"/"+AgentName, err)}
	}
	var pods []corev1.Pod
	if ds != nil {
		selector, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
		if err != nil {
			return []Result{{Check: "agents", Status: Fail, Message: fmt.Sprintf("DaemonSet %s/%s has an invalid selector: %v", Namespace, AgentName, err), Fix: installFix}}
		}
		list, err := kube.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
		if err != nil {
			return []Result{unreadable("agents", "the agents' pods", err)}
		}
		for _, p := range list.Items {
			if metav1.IsControlledBy(&p, ds) {
				pods = append(pods, p)
			}
		}
	}
	return Agents(nodes, ds, pods, vmis, outside)
}

type kubeletRead struct {
	settings *KubeletEviction
	why      string
}

// kubeletEvictions reads each node's kubelet configuration through the API server's node proxy
// (/api/v1/nodes/NAME/proxy/configz, what kubectl get --raw reads), a few nodes at a time.
func kubeletEvictions(ctx context.Context, kube kubernetes.Interface, nodes []string, timeout time.Duration) []kubeletRead {
	out := make([]kubeletRead, len(nodes))
	limit := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() {
			limit <- struct{}{}
			defer func() { <-limit }()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "configz").DoRaw(ctx)
			if err != nil {
				out[i].why = proxyError(err, raw)
				return
			}
			out[i].settings, err = ParseConfigz(raw)
			if err != nil {
				out[i].why = err.Error()
			}
		})
	}
	wg.Wait()
	return out
}

// proxyError says why a read through the node proxy failed: the proxy's own refusals (an address
// it will not proxy to, a kubelet that does not answer) come as a Status or plain text in the
// body, which client-go's error for a raw read leaves out.
func proxyError(err error, body []byte) string {
	var status metav1.Status
	if json.Unmarshal(body, &status) == nil && status.Kind == "Status" && status.Message != "" {
		return fmt.Sprintf("HTTP %d: %s", status.Code, status.Message)
	}
	text := strings.TrimSpace(string(body))
	if text == "" || json.Valid(body) {
		return err.Error()
	}
	if len(text) > 200 {
		text = text[:200] + "…"
	}
	var apiStatus apierrors.APIStatus
	if errors.As(err, &apiStatus) {
		return fmt.Sprintf("HTTP %d: %s", apiStatus.Status().Code, text)
	}
	return text
}

// ParseConfigz reads the eviction settings from a kubelet's /configz answer.
func ParseConfigz(raw []byte) (*KubeletEviction, error) {
	var z struct {
		KubeletConfig *kubeletconfigv1beta1.KubeletConfiguration `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &z); err != nil {
		return nil, fmt.Errorf("the kubelet's /configz: %w", err)
	}
	if z.KubeletConfig == nil {
		return nil, fmt.Errorf("the kubelet's /configz has no kubeletconfig")
	}
	const signal = "memory.available"
	return &KubeletEviction{
		SoftMemory:        z.KubeletConfig.EvictionSoft[signal],
		HardMemory:        z.KubeletConfig.EvictionHard[signal],
		MaxPodGracePeriod: int64(z.KubeletConfig.EvictionMaxPodGracePeriod),
	}, nil
}
