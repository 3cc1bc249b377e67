package webhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// Names the deployment manifests share with the controller (issue 8's contract).
const (
	ConfigurationName = "lifeboat-eviction"
	WebhookName       = "eviction.lifeboat.dev"
	Path              = "/validate-eviction"
	ServicePort       = 443
	fieldManager      = "lifeboat-controller"
	// timeoutSeconds is short: an eviction waits on it, and when lifeboat is slow or down the
	// eviction goes on (failurePolicy Ignore) to the disruption budget, which still protects the VM.
	timeoutSeconds = 5
)

// systemNamespaces are Kubernetes' own namespaces, whose evictions never reach the webhook.
var systemNamespaces = []string{metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// Endpoint is how the API server reaches the webhook: a URL (a local cluster whose API server runs
// outside it) or a Service.
type Endpoint struct {
	URL     string
	Service types.NamespacedName
}

// hosts are the names the serving certificate must carry for this endpoint.
func (e Endpoint) hosts() ([]string, error) {
	if e.URL != "" {
		u, err := url.Parse(e.URL)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" {
			return nil, fmt.Errorf("webhook URL %q: want https://HOST[:PORT]/PATH", e.URL)
		}
		return []string{u.Hostname()}, nil
	}
	if e.Service.Name == "" || e.Service.Namespace == "" {
		return nil, fmt.Errorf("the webhook needs a URL or a Service (namespace/name)")
	}
	svc := e.Service.Name + "." + e.Service.Namespace
	return []string{svc + ".svc", svc + ".svc.cluster.local", svc, e.Service.Name}, nil
}

// configuration is the ValidatingWebhookConfiguration that sends pods/eviction CREATE to the webhook.
func (e Endpoint) configuration(caBundle []byte) *admissionv1ac.ValidatingWebhookConfigurationApplyConfiguration {
	client := admissionv1ac.WebhookClientConfig().WithCABundle(caBundle...)
	if e.URL != "" {
		client.WithURL(e.URL)
	} else {
		client.WithService(admissionv1ac.ServiceReference().WithNamespace(e.Service.Namespace).WithName(e.Service.Name).
			WithPort(ServicePort).WithPath(Path))
	}
	return admissionv1ac.ValidatingWebhookConfiguration(ConfigurationName).WithWebhooks(
		admissionv1ac.ValidatingWebhook().WithName(WebhookName).
			WithClientConfig(client).
			WithRules(admissionv1ac.RuleWithOperations().
				WithOperations(admissionregistrationv1.Create).
				WithAPIGroups("").WithAPIVersions("v1").WithResources("pods/eviction").
				WithScope(admissionregistrationv1.NamespacedScope)).
			// An objectSelector cannot pick launcher pods: for pods/eviction the API server
			// matches it against the Eviction's labels, not the pod's. The system namespaces,
			// which hold no VM, are left out.
			WithNamespaceSelector(metav1ac.LabelSelector().WithMatchExpressions(metav1ac.LabelSelectorRequirement().
				WithKey(corev1.LabelMetadataName).WithOperator(metav1.LabelSelectorOpNotIn).WithValues(systemNamespaces...))).
			// Only launcher pods' evictions: they are named so (evacuation/vmi); a look-alike
			// a tenant names so is told apart by its controller.
			WithMatchConditions(admissionv1ac.MatchCondition().WithName("launcher-pods").
				WithExpression(fmt.Sprintf("request.name.startsWith(%q)", vmi.LauncherPodPrefix))).
			WithFailurePolicy(admissionregistrationv1.Ignore).
			WithSideEffects(admissionregistrationv1.SideEffectClassNoneOnDryRun).
			WithMatchPolicy(admissionregistrationv1.Equivalent).
			WithTimeoutSeconds(timeoutSeconds).
			WithAdmissionReviewVersions("v1"),
	)
}

// register writes the configuration so that it trusts caBundle as well as the still valid CAs
// other replicas put there: each replica serves with a certificate of its own CA, and the API
// server must trust whichever replica the Service picks. The write is conditional on the version
// read, so two replicas registering at once cannot drop each other's CA.
func (e Endpoint) register(ctx context.Context, kube kubernetes.Interface, caBundle []byte, now time.Time) error {
	configs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	apply := e.configuration(caBundle)
	existing, err := configs.Get(ctx, ConfigurationName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", ConfigurationName, err)
	default:
		var others []byte
		for _, w := range existing.Webhooks {
			if w.Name == WebhookName {
				others = w.ClientConfig.CABundle
			}
		}
		apply = e.configuration(MergeBundles(caBundle, others, now)).WithResourceVersion(existing.ResourceVersion)
	}
	if _, err := configs.Apply(ctx, apply, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
		return fmt.Errorf("writing ValidatingWebhookConfiguration %s: %w", ConfigurationName, err)
	}
	return nil
}

// MergeBundles is own followed by the certificates of others that are still valid at now and
// not in own; what does not parse as a certificate is dropped.
func MergeBundles(own, others []byte, now time.Time) []byte {
	out := bytes.TrimSpace(own)
	for rest := others; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return out
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if block.Type != "CERTIFICATE" || err != nil || now.After(cert.NotAfter) {
			continue
		}
		encoded := pem.EncodeToMemory(block)
		if bytes.Contains(out, bytes.TrimSpace(encoded)) {
			continue
		}
		out = append(append(out, '\n'), bytes.TrimSpace(encoded)...)
	}
}
