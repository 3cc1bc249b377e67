package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Events on the LifeboatConfig.
const (
	// ReasonEvictionWebhookStrict: the API server presented its client certificate for the first
	// time; the webhook is strict from then on.
	ReasonEvictionWebhookStrict = "EvictionWebhookStrict"
	// ReasonEvictionWebhookRefusedCaller: the first review a strict replica refused.
	ReasonEvictionWebhookRefusedCaller = "EvictionWebhookRefusedCaller"
)

// recordTimeout bounds the first write of the ratchet inside the authenticated call that set it;
// if it does not succeed by then, it is retried in the background.
const recordTimeout = 2 * time.Second

// authenticate says whether the TLS peer is the API server: a client certificate that chains to
// roots for client auth and names one of names. Otherwise it says what the caller presented.
func authenticate(state *tls.ConnectionState, roots *x509.CertPool, names []string) (string, bool) {
	if state == nil || len(state.PeerCertificates) == 0 {
		return "no client certificate", false
	}
	leaf := state.PeerCertificates[0]
	cn := leaf.Subject.CommonName
	if roots == nil {
		return fmt.Sprintf("a client certificate for %q, and no --webhook-client-ca to check it", cn), false
	}
	intermediates := x509.NewCertPool()
	for _, c := range state.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Sprintf("a client certificate for %q that --webhook-client-ca does not verify (%v)", cn, err), false
	}
	if !slices.Contains(names, cn) {
		return fmt.Sprintf("a client certificate for %q, a name not in --webhook-client-names", cn), false
	}
	return cn, true
}

// seenInConfig is when the LifeboatConfig records the API server's first authenticated call; nil
// if it does not (or there is no LifeboatConfig).
func seenInConfig(config *v1alpha1.LifeboatConfig) *metav1.Time {
	if config == nil || config.Status.EvictionWebhook == nil {
		return nil
	}
	return config.Status.EvictionWebhook.AuthenticatedCallSeen
}

// mode is this replica's mode now. The ratchet holds in memory once seen, so that neither a slow
// write nor a deleted LifeboatConfig turns a replica permissive again.
func (s *Server) mode() (Mode, string) {
	if !s.seen.Load() {
		if c, err := s.configs.Get(v1alpha1.ConfigName); err == nil && seenInConfig(c) != nil {
			s.seen.Store(true)
			s.recorded.Store(true)
		}
	}
	m, reason := ModeOf(s.opts.ClientAuth, s.opts.ClientCAs != nil, s.seen.Load())
	s.metrics.setMode(m)
	return m, reason
}

// sawAuthenticatedCall turns the ratchet: this replica is strict at once, and the LifeboatConfig
// records it for every replica and restart (in the background if the first write fails).
func (s *Server) sawAuthenticatedCall(ctx context.Context) {
	if s.seen.Load() && s.recorded.Load() {
		return
	}
	s.ratchet.Lock()
	defer s.ratchet.Unlock()
	if !s.seen.Swap(true) {
		s.metrics.setMode(ModeStrict)
		s.log.Info("the API server presented its client certificate: the eviction webhook is strict from now on, and acts only for callers presenting it",
			"mode", ModeStrict, "reason", ReasonAuthenticatedCallSeen)
	}
	if s.recorded.Load() || s.recording {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	err := s.record(ctx)
	if err == nil {
		return
	}
	s.log.Error("recording the API server's authenticated call in the LifeboatConfig, will retry", "err", err)
	s.recording = true
	go func() {
		backoff := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: time.Minute}
		_ = wait.ExponentialBackoffWithContext(s.runCtx, backoff, func(ctx context.Context) (bool, error) {
			if err := s.record(ctx); err != nil {
				s.log.Error("recording the API server's authenticated call in the LifeboatConfig, will retry", "err", err)
				return false, nil
			}
			return true, nil
		})
	}()
}

// record writes the ratchet into the LifeboatConfig's status, unless it is there already.
func (s *Server) record(ctx context.Context) error {
	configs := s.lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	var written *v1alpha1.LifeboatConfig
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := configs.Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if seenInConfig(c) != nil {
			return nil
		}
		if c.Status.EvictionWebhook == nil {
			c.Status.EvictionWebhook = &v1alpha1.EvictionWebhookStatus{}
		}
		now := metav1.Now()
		c.Status.EvictionWebhook.AuthenticatedCallSeen = &now
		written, err = configs.UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	s.recorded.Store(true)
	if written != nil {
		s.recorder.Event(written, corev1.EventTypeNormal, ReasonEvictionWebhookStrict,
			"the API server presented its client certificate to the eviction webhook: from now on every replica acts only for callers presenting it")
	}
	return nil
}

// stillPermissive reads the LifeboatConfig from the API server, not the cache, right before an
// unauthenticated review marks a VM: another replica may have seen the API server authenticate a
// moment ago.
func (s *Server) stillPermissive(ctx context.Context) (bool, error) {
	if s.seen.Load() {
		return false, nil
	}
	c, err := s.lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	case seenInConfig(c) != nil:
		s.seen.Store(true)
		s.metrics.setMode(ModeStrict)
		return false, nil
	}
	return true, nil
}

// refusalFix says what to change after a strict replica refused a caller, by why it is strict.
func refusalFix(reason string) string {
	if reason == ReasonStrictByFlag {
		return "if this was the API server, evictions of VM pods now reach only their disruption budgets: give the API server a client certificate that --webhook-client-ca verifies, named in --webhook-client-names (docs/operations.md), or drop --webhook-client-auth=strict where the API server cannot present one"
	}
	return "the API server presented its client certificate before (LifeboatConfig status.evictionWebhook.authenticatedCallSeen); if this was the API server, it no longer does: restore its AdmissionConfiguration or certificate, or, if the cluster can no longer present one, delete and recreate the LifeboatConfig to let the webhook act on unauthenticated reviews within bounds (docs/operations.md)"
}

// ReportMode keeps the LifeboatConfig's EvictionWebhookStrict condition true to the mode until ctx
// ends. One replica runs it (the leader), so that replicas with different flags during a rollout
// do not overwrite each other.
func (s *Server) ReportMode(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return nil
	}
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	reg, err := s.configInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	})
	if err != nil {
		return fmt.Errorf("eviction webhook: %w", err)
	}
	defer func() { _ = s.configInformer.RemoveEventHandler(reg) }()
	retryAfter := time.Second
	for {
		var again <-chan time.Time
		if err := s.reportMode(ctx); err != nil {
			s.log.Error("writing the EvictionWebhookStrict condition, will retry", "err", err, "after", retryAfter)
			again = time.After(retryAfter)
			retryAfter = min(2*retryAfter, time.Minute)
		} else {
			retryAfter = time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-again:
		}
	}
}

// reportMode writes the condition if the cached LifeboatConfig's differs.
func (s *Server) reportMode(ctx context.Context) error {
	cached, err := s.configs.Get(v1alpha1.ConfigName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	want := ModeCondition(s.opts.ClientAuth, s.opts.ClientCAs != nil, seenInConfig(cached))
	if c := meta.FindStatusCondition(cached.Status.Conditions, want.Type); c != nil && c.Status == want.Status && c.Reason == want.Reason && c.Message == want.Message {
		return nil
	}
	c := cached.DeepCopy()
	meta.SetStatusCondition(&c.Status.Conditions, want)
	_, err = s.lifeboat.LifeboatV1alpha1().LifeboatConfigs().UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// A newer version comes through the informer.
		return nil
	}
	return err
}
