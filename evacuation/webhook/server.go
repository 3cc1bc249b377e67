package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"

	"github.com/prometheus/client_golang/prometheus"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/placement"
)

// ReasonEvacuationRequested is the Event of a new mark on a VMI, as the agent's.
const ReasonEvacuationRequested = "EvacuationRequested"

// markTimeout bounds the status write of a mark, inside the API server's timeout for the webhook.
const markTimeout = (timeoutSeconds - 1) * time.Second

// Options configure the webhook.
type Options struct {
	// Listen is the address to serve on, for example ":8443".
	Listen   string
	Endpoint Endpoint
	// CertValidity is how long each serving certificate lasts; it is replaced at two thirds of that.
	CertValidity time.Duration
	// ClientCAs and ClientNames say who the API server is: a caller whose client certificate
	// chains to ClientCAs and names one of ClientNames (the certificate the API server presents
	// to webhooks, set in its AdmissionConfiguration; docs/operations.md). ClientCAs may be nil
	// with ClientAuthAuto: then no caller authenticates.
	ClientCAs   *x509.CertPool
	ClientNames []string
	// ClientAuth says what happens to everyone else: in strict mode they are answered 403 and
	// change nothing; in permissive mode (auto, until the API server has once authenticated) the
	// webhook acts for them within Unauthenticated's bounds.
	ClientAuth ClientAuth
}

// Server is the eviction webhook.
type Server struct {
	kube           kubernetes.Interface
	lifeboat       lifeboatclient.Interface
	pods           corelisters.PodLister
	vmis           lifeboatlisters.VirtualMachineInstanceLister
	configs        lifeboatlisters.LifeboatConfigLister
	configInformer cache.SharedIndexInformer
	nodes          corelisters.NodeLister
	synced         []cache.InformerSynced
	recorder       record.EventRecorder
	opts           Options
	certs          *certs
	metrics        metrics
	log            *slog.Logger
	// runCtx is Run's context, for the ratchet's background writes.
	runCtx context.Context

	// seen: this replica has seen the API server authenticate, or the LifeboatConfig says one
	// did; recorded: the LifeboatConfig says so. Neither is ever reset.
	seen, recorded atomic.Bool
	// ratchet serialises turning it; recording says a background write is under way.
	ratchet   sync.Mutex
	recording bool
	// refusedOnce and actedOnce log the first refused review and the first unauthenticated one
	// acted on, with what to change.
	refusedOnce, actedOnce sync.Once
}

// New makes the webhook and its first certificate. The pod informer should hold launcher pods only:
// a pod it does not know is not a VM's; nodes holds every Node (whether a VM's node is cordoned).
func New(kube kubernetes.Interface, lb lifeboatclient.Interface, pods coreinformers.PodInformer, vmis lifeboatinformers.VirtualMachineInstanceInformer,
	configs lifeboatinformers.LifeboatConfigInformer, nodes cache.SharedIndexInformer, recorder record.EventRecorder, opts Options, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	switch opts.ClientAuth {
	case ClientAuthAuto:
	case ClientAuthStrict:
		if opts.ClientCAs == nil {
			return nil, errors.New("eviction webhook: strict client authentication needs the CAs of the API server's client certificate")
		}
	default:
		return nil, fmt.Errorf("eviction webhook: client authentication %q: want %s or %s", opts.ClientAuth, ClientAuthAuto, ClientAuthStrict)
	}
	hosts, err := opts.Endpoint.hosts()
	if err != nil {
		return nil, err
	}
	c, err := newCerts(hosts, opts.CertValidity)
	if err != nil {
		return nil, err
	}
	return &Server{
		kube: kube, lifeboat: lb, pods: pods.Lister(), vmis: vmis.Lister(), configs: configs.Lister(), configInformer: configs.Informer(),
		nodes:    corelisters.NewNodeLister(nodes.GetIndexer()),
		synced:   []cache.InformerSynced{pods.Informer().HasSynced, vmis.Informer().HasSynced, configs.Informer().HasSynced, nodes.HasSynced},
		recorder: recorder, opts: opts, certs: c, metrics: newMetrics(reg, c.expiry), log: log.With("component", "eviction-webhook"),
		runCtx: context.Background(),
	}, nil
}

// Run serves until ctx ends: it waits for the caches, registers the webhook with its CA bundle,
// and replaces the certificate before it expires.
func (s *Server) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return errors.New("eviction webhook: caches did not sync")
	}
	s.runCtx = ctx
	s.logMode()
	// Another replica's record turns this one strict (and its metric) without waiting for a call.
	reg, err := s.configInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { s.mode() }, UpdateFunc: func(any, any) { s.mode() },
	})
	if err != nil {
		return fmt.Errorf("eviction webhook: %w", err)
	}
	defer func() { _ = s.configInformer.RemoveEventHandler(reg) }()
	l, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("eviction webhook: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, s)
	srv := &http.Server{
		Handler: mux,
		// A certificate is asked for but checked per request (authenticate): one that does not
		// verify makes its caller unauthenticated, which permissive mode still answers.
		TLSConfig: &tls.Config{GetCertificate: s.certs.getCertificate, MinVersion: tls.VersionTLS12,
			ClientAuth: tls.RequestClientCert},
		ReadHeaderTimeout: 10 * time.Second,
		// An AdmissionReview is small and answered within the API server's 5 s webhook timeout;
		// bounds keep slow clients from pinning goroutines and buffers (issue 26).
		ReadTimeout:    15 * time.Second,
		WriteTimeout:   15 * time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(l, "", "") }()
	s.log.Info("serving", "address", l.Addr().String(), "url", s.opts.Endpoint.URL, "service", s.opts.Endpoint.Service.String())

	if err := s.registerUntilDone(ctx, s.certs.caBundle()); err == nil {
		s.rotate(ctx)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("eviction webhook: %w", err)
	}
	return nil
}

// registerUntilDone writes the webhook configuration, retrying until it succeeds or ctx ends.
func (s *Server) registerUntilDone(ctx context.Context, bundle []byte) error {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: time.Minute}
	return wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		if err := s.opts.Endpoint.register(ctx, s.kube, bundle, time.Now()); err != nil {
			s.log.Error("registering the webhook, will retry", "err", err)
			return false, nil
		}
		s.log.Info("registered", "configuration", ConfigurationName)
		return true, nil
	})
}

// reregisterInterval is how often a replica checks that the configuration trusts its CA.
const reregisterInterval = 5 * time.Minute

// rotate replaces the certificate at two thirds of its life until ctx ends: first the configuration
// trusts both CAs, then the listener serves the new certificate.
func (s *Server) rotate(ctx context.Context) {
	for {
		wait, recheck := time.Until(s.certs.rotateAt()), false
		if wait > reregisterInterval {
			wait, recheck = reregisterInterval, true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if recheck {
			// Keeps this replica's CA in the configuration whatever others wrote, and drops
			// expired ones.
			if err := s.registerUntilDone(ctx, s.certs.caBundle()); err != nil {
				return
			}
			continue
		}
		serving, ca, bundle, err := s.certs.next()
		if err != nil {
			s.log.Error("making the next certificate, will retry", "err", err)
			if !sleep(ctx, 10*time.Second) {
				return
			}
			continue
		}
		if err := s.registerUntilDone(ctx, bundle); err != nil {
			return
		}
		s.certs.install(serving, ca, bundle)
		s.metrics.rotations.Inc()
		s.log.Info("rotated the serving certificate", "expires", serving.Leaf.NotAfter)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// logMode says at start which mode this replica is in, and what that means.
func (s *Server) logMode() {
	mode, reason := s.mode()
	var seen *metav1.Time
	if c, err := s.configs.Get(v1alpha1.ConfigName); err == nil {
		seen = seenInConfig(c)
	}
	s.log.Info("eviction webhook mode", "mode", mode, "reason", reason, "meaning", ModeCondition(s.opts.ClientAuth, s.opts.ClientCAs != nil, seen).Message)
}

// ServeHTTP answers one AdmissionReview.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	caller, authenticated := authenticate(r.TLS, s.opts.ClientCAs, s.opts.ClientNames)
	if authenticated {
		s.sawAuthenticatedCall(r.Context())
	} else if mode, reason := s.mode(); mode == ModeStrict {
		s.metrics.unauthenticated.Inc()
		s.refuse(r, caller, reason)
		http.Error(w, "the eviction webhook answers only the API server", http.StatusForbidden)
		return
	}
	review, err := decodeReview(r.Body)
	if err != nil {
		http.Error(w, "want an admission.k8s.io/v1 AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	req := review.Request
	d, strategy := s.admit(r.Context(), req, authenticated)
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: d.Allowed()}
	if !d.Allowed() {
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: d.Code(), Reason: metav1.StatusReasonTooManyRequests, Message: d.Message}
	}
	review.Request, review.Response = nil, resp
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&review); err != nil {
		s.log.Error("writing the admission response", "err", err)
	}
	s.metrics.decisions.WithLabelValues(strategy, string(d.Answer)).Inc()
	s.metrics.latency.Observe(time.Since(start).Seconds())
	if !authenticated {
		s.metrics.unauthenticatedReviews.WithLabelValues(string(d.Answer)).Inc()
	}
	if !d.Allowed() || strategy != strategyNotAVM {
		s.log.Info("eviction", "pod", req.Namespace+"/"+req.Name, "user", req.UserInfo.Username, "authenticated", authenticated, "dryRun", dryRun(req),
			"strategy", strategy, "answer", d.Answer, "message", d.Message)
	}
}

// refuse logs a refused caller; the first refusal of this replica also says what to change, in
// the log and in a Warning Event on the LifeboatConfig.
func (s *Server) refuse(r *http.Request, caller, reason string) {
	first := false
	s.refusedOnce.Do(func() { first = true })
	if !first {
		s.log.Warn("refused an admission review from a caller that is not the API server", "remote", r.RemoteAddr, "caller", caller)
		return
	}
	fix := refusalFix(reason)
	s.log.Error("refused an admission review from a caller that is not the API server (the first this replica refused)",
		"remote", r.RemoteAddr, "caller", caller, "mode", ModeStrict, "reason", reason, "fix", fix)
	if c, err := s.configs.Get(v1alpha1.ConfigName); err == nil {
		s.recorder.Eventf(c, corev1.EventTypeWarning, ReasonEvictionWebhookRefusedCaller,
			"the eviction webhook (strict, %s) refused a caller presenting %s: %s", reason, caller, fix)
	}
}

// maxReviewBytes bounds the body read: an eviction's review is a few KiB.
const maxReviewBytes = 1 << 20

// decodeReview reads an AdmissionReview with a request, of at most maxReviewBytes.
func decodeReview(body io.Reader) (*admissionv1.AdmissionReview, error) {
	data, err := io.ReadAll(io.LimitReader(body, maxReviewBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxReviewBytes {
		return nil, fmt.Errorf("the body is larger than %d bytes", maxReviewBytes)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &review); err != nil {
		return nil, err
	}
	if review.Request == nil {
		return nil, errors.New("the AdmissionReview has no request")
	}
	return &review, nil
}

// strategyNotAVM is the strategy label of an eviction of a pod that is not a running VM's.
const strategyNotAVM = "NotAVM"

// admit decides one eviction and marks the VMI when the decision says so; a review that is not
// authenticated is held to Unauthenticated's bounds.
func (s *Server) admit(ctx context.Context, req *admissionv1.AdmissionRequest, authenticated bool) (Decision, string) {
	if req.Resource.Resource != "pods" || req.SubResource != "eviction" || req.Operation != admissionv1.Create {
		return Decision{Answer: AnswerAllowed}, strategyNotAVM
	}
	pod, vmi := s.observe(req.Namespace, req.Name)
	var config *v1alpha1.LifeboatConfig
	if c, err := s.configs.Get(v1alpha1.ConfigName); err == nil {
		config = c
	}
	strategy := strategyNotAVM
	if vmi != nil {
		strategy = string(v1alpha1.EffectiveEvictionStrategy(vmi, config))
	}
	d := s.decide(pod, vmi, config, dryRun(req), authenticated)
	if !d.Mark {
		return d, strategy
	}
	marked, err := s.mark(ctx, pod, vmi, config, req.UserInfo.Username, authenticated)
	if err != nil {
		s.log.Error("marking the VMI for evacuation", "vmi", vmi.Namespace+"/"+vmi.Name, "err", err)
		return Decision{Answer: AnswerDenied, Message: fmt.Sprintf("VMI %q could not be marked for evacuation (%v); try again", vmi.Namespace+"/"+vmi.Name, err)}, strategy
	}
	return marked, strategy
}

// observe finds the launcher pod and its VMI in the caches; nil when the pod is not a launcher or
// its VMI is gone.
func (s *Server) observe(namespace, name string) (*corev1.Pod, *v1alpha1.VirtualMachineInstance) {
	pod, err := s.pods.Pods(namespace).Get(name)
	if err != nil || pod.Labels[v1alpha1.LabelRole] != v1alpha1.RoleLauncher {
		return nil, nil
	}
	vmi, err := s.vmis.VirtualMachineInstances(namespace).Get(pod.Labels[v1alpha1.LabelVMIName])
	// A pod a tenant labels as a launcher is not one: a launcher's controller is its VMI.
	if ref := v1alpha1.VMIController(pod); err != nil || string(vmi.UID) != pod.Labels[v1alpha1.LabelVMIUID] || ref == nil || ref.UID != vmi.UID {
		return pod, nil
	}
	return pod, vmi
}

// decide is Decide on the VMI as the nodes stand now (placed), held to Unauthenticated's bounds
// for a review that is not authenticated.
func (s *Server) decide(pod *corev1.Pod, vmi *v1alpha1.VirtualMachineInstance, config *v1alpha1.LifeboatConfig, dryRun, authenticated bool) Decision {
	vmi = s.placed(vmi)
	d := Decide(pod, vmi, config, dryRun)
	if authenticated || d.Answer != AnswerEvacuating {
		return d
	}
	cordoned := false
	if n, err := s.nodes.Get(vmi.Status.NodeName); err == nil {
		cordoned = n.Spec.Unschedulable
	}
	return Unauthenticated(d, vmi, v1alpha1.EffectiveEvictionStrategy(vmi, config), cordoned,
		v1alpha1.UnauthenticatedMigrationInterval(config), time.Now())
}

// placed is vmi (nil: none) with the LiveMigratable condition the nodes call for now
// (placement.Placer: NoTargetNode when no other node could take the VM, back to True when one
// could). The evacuation controller writes that condition; a drain does not wait for the write,
// so that a VM that cannot leave is answered as one at once, never marked for a migration that
// could only wait out its pending timeout. The VMI itself is not changed.
func (s *Server) placed(vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	if vmi == nil {
		return nil
	}
	nodes, err := s.nodes.List(labels.Everything())
	if err != nil {
		return vmi
	}
	c := placement.NewPlacer(nodes).Condition(vmi, metav1.Now())
	if c == nil {
		return vmi
	}
	vmi = vmi.DeepCopy()
	meta.SetStatusCondition(&vmi.Status.Conditions, *c)
	return vmi
}

// mark decides again on the VMI as the API server has it and writes the mark; the answer is the
// decision on that fresh copy (another eviction may have marked it a moment ago). For a review
// that is not authenticated it first reads the LifeboatConfig afresh: another replica may have
// turned the ratchet a moment ago.
func (s *Server) mark(ctx context.Context, pod *corev1.Pod, cached *v1alpha1.VirtualMachineInstance, config *v1alpha1.LifeboatConfig, user string, authenticated bool) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	if !authenticated {
		permissive, err := s.stillPermissive(ctx)
		if err != nil {
			return Decision{}, err
		}
		if !permissive {
			return Decision{Answer: AnswerBounded, Message: "the API server has presented its client certificate to the eviction webhook, which now acts only for callers presenting it"}, nil
		}
		s.actedOnce.Do(func() {
			s.log.Warn("acting on an eviction review the webhook cannot authenticate (permissive mode): it may mark a VM for a live migration only, once per VMI per spec.evictionWebhook.unauthenticatedMigrationInterval unless its node is cordoned; give the API server a client certificate to make the webhook strict (docs/operations.md)",
				"vmi", cached.Namespace+"/"+cached.Name, "user", user)
		})
		user = "an unauthenticated caller naming " + user
	}
	vmis := s.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(cached.Namespace)
	var d Decision
	var marked *v1alpha1.VirtualMachineInstance
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vmi, err := vmis.Get(ctx, cached.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			d, marked = Decide(pod, nil, config, false), nil
			return nil
		}
		if err != nil {
			return err
		}
		if d = s.decide(pod, vmi, config, false, authenticated); !d.Mark {
			return nil
		}
		msg := fmt.Sprintf("an eviction of pod %s by %s asked the VM to leave node %s", pod.Name, user, vmi.Status.NodeName)
		v1alpha1.MarkForEvacuation(&vmi.Status, v1alpha1.MigrationCauseAPIEviction, msg, metav1.Now())
		marked, err = vmis.UpdateStatus(ctx, vmi, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return Decision{}, err
	}
	if marked != nil {
		s.recorder.Eventf(marked, corev1.EventTypeNormal, ReasonEvacuationRequested,
			"an eviction of pod %s by %s marked the VM for evacuation from node %s (cause APIEviction)", pod.Name, user, marked.Status.NodeName)
	}
	return d, nil
}

// dryRun reports whether the eviction is a dry run: asked for in the request's options, or in the
// Eviction's deleteOptions, which the API server honours as well (kubectl drain --dry-run=server).
func dryRun(req *admissionv1.AdmissionRequest) bool {
	if req.DryRun != nil && *req.DryRun {
		return true
	}
	var eviction policyv1.Eviction
	if err := json.Unmarshal(req.Object.Raw, &eviction); err != nil {
		return false
	}
	return eviction.DeleteOptions != nil && len(eviction.DeleteOptions.DryRun) > 0
}
