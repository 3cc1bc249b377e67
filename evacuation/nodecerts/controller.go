package nodecerts

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	certinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// Controller approves and signs the certificate signing requests for lifeboat's signer.
type Controller struct {
	kube     kubernetes.Interface
	ca       *CA
	csrs     certlisters.CertificateSigningRequestLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	maxLife  time.Duration
	// agent is the agents' username (AgentUsername).
	agent string
	// requests counts the requests decided, by result (signed, denied).
	requests *prometheus.CounterVec
	log      *slog.Logger
}

// NewInformer watches only the requests for lifeboat's signer.
func NewInformer(kube kubernetes.Interface) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", migrationtls.SignerName).String()
	}))
}

// AgentUsername is the username of the tokens of the agents' service account, in lifeboat's
// namespace; only they get a node's certificate for a token bound to the node.
func AgentUsername(namespace, serviceAccount string) string {
	return "system:serviceaccount:" + namespace + ":" + serviceAccount
}

// New wires the signer to its informer; certificates live at most maxLifetime (a request may ask
// for less with spec.expirationSeconds). agent is the agents' username (AgentUsername).
func New(kube kubernetes.Interface, ca *CA, agent string, csrs certinformers.CertificateSigningRequestInformer, recorder record.EventRecorder, maxLifetime time.Duration,
	reg prometheus.Registerer, log *slog.Logger) *Controller {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lifeboat_node_certificate_requests_total",
		Help: "Requests for lifeboat's signer lifeboat.dev/migration the signer decided, by result (signed, denied: the reason is on the request and in an Event).",
	}, []string{"result"})
	reg.MustRegister(requests)
	c := &Controller{
		requests: requests,
		kube:     kube, ca: ca, csrs: csrs.Lister(), synced: []cache.InformerSynced{csrs.Informer().HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodecerts"}),
		recorder: recorder, maxLife: maxLifetime, agent: agent, log: log.With("controller", "nodecerts"),
	}
	_, _ = csrs.Informer().AddEventHandler(worker.Handler(func(obj any) { worker.Enqueue(c.queue, obj) }))
	return c
}

// Run processes the queue until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	return worker.Run(ctx, "nodecerts", c.queue, c.synced, workers, func(ctx context.Context, key string) (time.Duration, error) {
		return 0, c.sync(ctx, key)
	}, c.log)
}

func (c *Controller) sync(ctx context.Context, name string) error {
	cached, err := c.csrs.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if cached.Spec.SignerName != migrationtls.SignerName || len(cached.Status.Certificate) > 0 ||
		hasCondition(cached, certificatesv1.CertificateDenied) || hasCondition(cached, certificatesv1.CertificateFailed) {
		return nil
	}
	csr := cached.DeepCopy()
	req, err := parseRequest(csr.Spec.Request)
	var d Decision
	if err != nil {
		d = Decision{Reason: ReasonMalformed, Message: err.Error()}
	} else if d, err = Review(c.request(ctx, csr, req)); err != nil {
		return err
	}
	csrs := c.kube.CertificatesV1().CertificateSigningRequests()
	if !d.Approve {
		// A request someone else approved is failed instead: Denied cannot join Approved.
		if hasCondition(csr, certificatesv1.CertificateApproved) {
			csr.Status.Conditions = append(csr.Status.Conditions, condition(certificatesv1.CertificateFailed, d))
			_, err = csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{})
		} else {
			csr.Status.Conditions = append(csr.Status.Conditions, condition(certificatesv1.CertificateDenied, d))
			_, err = csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("refusing %s: %w", csr.Name, err)
		}
		c.requests.WithLabelValues("denied").Inc()
		c.recorder.Event(csr, corev1.EventTypeWarning, d.Reason, "denied: "+d.Message)
		c.log.Info("denied a node certificate", "csr", csr.Name, "user", csr.Spec.Username, "reason", d.Reason, "message", d.Message)
		return nil
	}
	if !hasCondition(csr, certificatesv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, condition(certificatesv1.CertificateApproved, d))
		if csr, err = csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("approving %s: %w", csr.Name, err)
		}
	}
	life := c.maxLife
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < life {
		life = time.Duration(*s) * time.Second
	}
	signed, err := c.ca.Sign(req, d.Node, life, time.Now())
	if err != nil {
		return err
	}
	csr.Status.Certificate = signed
	if _, err := csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("recording the certificate of %s: %w", csr.Name, err)
	}
	c.requests.WithLabelValues("signed").Inc()
	c.log.Info("signed a node certificate", "csr", csr.Name, "node", d.Node, "user", csr.Spec.Username, "lifetime", life)
	return nil
}

// request gathers what Review needs; the RBAC question goes to the API server's authorizer.
func (c *Controller) request(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) Request {
	var tokenNode string
	if v := csr.Spec.Extra[migrationtls.NodeNameExtra]; len(v) == 1 {
		tokenNode = v[0]
	}
	return Request{
		CSR: req, Usages: csr.Spec.Usages, Username: csr.Spec.Username, TokenNode: tokenNode, Agent: c.agent,
		MayRequestForNode: func(node string) (bool, error) {
			extra := map[string]authorizationv1.ExtraValue{}
			for k, v := range csr.Spec.Extra {
				extra[k] = authorizationv1.ExtraValue(v)
			}
			sar, err := c.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: csr.Spec.Username, UID: csr.Spec.UID, Groups: csr.Spec.Groups, Extra: extra,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: v1alpha1.GroupName, Resource: "nodecertificates", Verb: "create", Name: node},
			}}, metav1.CreateOptions{})
			if err != nil {
				return false, fmt.Errorf("asking whether %s may request node %s's certificate: %w", csr.Spec.Username, node, err)
			}
			return sar.Status.Allowed, nil
		},
	}
}

func parseRequest(b []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("spec.request is not a PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("spec.request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("spec.request is not signed by its own key: %w", err)
	}
	return req, nil
}

func condition(t certificatesv1.RequestConditionType, d Decision) certificatesv1.CertificateSigningRequestCondition {
	return certificatesv1.CertificateSigningRequestCondition{Type: t, Status: corev1.ConditionTrue, Reason: d.Reason, Message: d.Message, LastUpdateTime: metav1.Now()}
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t {
			return true
		}
	}
	return false
}
