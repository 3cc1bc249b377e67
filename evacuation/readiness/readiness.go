// Package readiness keeps the LifeboatConfig's Ready condition: what the leading controller can
// honestly know of itself (it leads and runs the controllers), of the CRDs it reads and writes (as
// its types expect) and of the eviction webhook (registered with a CA bundle). The webhook's mode
// (EvictionWebhookStrict) and the nodes whose VMs are at risk (VMsAtRisk) are conditions of their own.
package readiness

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// Reasons of the Ready condition.
const (
	ReasonReady                = "ControllerReady"
	ReasonCRDsNotCurrent       = "CRDsNotCurrent"
	ReasonWebhookNotRegistered = "WebhookNotRegistered"
	ReasonWebhookNotServed     = "WebhookNotServed"
	ReasonNoLeader             = "NoLeader"
)

// Webhook is what the leader knows of the eviction webhook.
type Webhook struct {
	// Served: this controller serves the webhook (--webhook-listen).
	Served bool
	// Registered: the ValidatingWebhookConfiguration has the webhook with a CA bundle; Problem
	// says what is wrong otherwise.
	Registered bool
	Problem    string
}

// Input is what the Ready condition is decided from.
type Input struct {
	// Leader is the replica that leads and writes the condition.
	Leader string
	// CRDs are check.CRD's results for lifeboat's CRDs against this controller's types.
	CRDs    []check.Result
	Webhook Webhook
}

// Condition is the LifeboatConfig's Ready condition: True when the leader runs the controllers,
// every CRD is as its types expect, and the eviction webhook is served and registered; False with
// the first thing that is not, and what to do.
func Condition(in Input) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConfigConditionReady, Status: metav1.ConditionFalse}
	var stale []string
	for _, r := range in.CRDs {
		if r.Status != check.OK {
			stale = append(stale, r.Check+": "+r.Message)
		}
	}
	leads := fmt.Sprintf("replica %s leads and runs the controllers", in.Leader)
	switch {
	case len(stale) > 0:
		c.Reason = ReasonCRDsNotCurrent
		c.Message = fmt.Sprintf("%s, but %s; apply the CRDs of the release the controller runs: kubectl apply --server-side -f manifests/crds/", leads, strings.Join(stale, "; "))
	case !in.Webhook.Served:
		c.Reason = ReasonWebhookNotServed
		c.Message = leads + ", but it serves no eviction webhook (no --webhook-listen): drains and the descheduler reach only the VMs' disruption budgets, which start no migration (manifests/controller.yaml sets it)"
	case !in.Webhook.Registered:
		c.Reason = ReasonWebhookNotRegistered
		c.Message = fmt.Sprintf("%s, but the eviction webhook is not registered (%s): drains and the descheduler reach only the VMs' disruption budgets; kubectl -n %s logs deploy/%s",
			leads, in.Webhook.Problem, check.Namespace, check.ControllerName)
	default:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonReady
		c.Message = fmt.Sprintf("%s; the CRDs are as it expects; the eviction webhook is registered (conditions %s and %s say how far it and the nodes protect VMs)",
			leads, v1alpha1.ConfigConditionEvictionWebhookStrict, v1alpha1.ConfigConditionVMsAtRisk)
	}
	return c
}

// Stopped is the Ready condition a leader leaves when it stops leading.
func Stopped(leader string, at time.Time) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConfigConditionReady, Status: metav1.ConditionFalse, Reason: ReasonNoLeader,
		Message: fmt.Sprintf("replica %s stopped leading at %s; no controller runs until another replica leads (kubectl -n %s get lease %s; kubectl lifeboat check)",
			leader, at.UTC().Format(time.RFC3339), check.Namespace, check.LeaseName)}
}

// Registration reads the webhook's registration (nil: none) as Webhook does.
func Registration(config *admissionregistrationv1.ValidatingWebhookConfiguration) (bool, string) {
	if config == nil {
		return false, "no ValidatingWebhookConfiguration " + webhook.ConfigurationName
	}
	for _, w := range config.Webhooks {
		if w.Name != webhook.WebhookName {
			continue
		}
		if len(w.ClientConfig.CABundle) == 0 {
			return false, "registered without a CA bundle: the API server cannot verify it"
		}
		if w.ClientConfig.URL == nil && w.ClientConfig.Service == nil {
			return false, "registered with neither a URL nor a Service"
		}
		return true, ""
	}
	return false, fmt.Sprintf("ValidatingWebhookConfiguration %s has no webhook %s", webhook.ConfigurationName, webhook.WebhookName)
}

// Controller keeps the Ready condition while its replica leads.
type Controller struct {
	kube     kubernetes.Interface
	lb       lifeboatclient.Interface
	configs  lifeboatlisters.LifeboatConfigLister
	informer cache.SharedIndexInformer
	leader   string
	webhook  bool
	interval time.Duration
	log      *slog.Logger
}

// New makes the controller; leader names this replica, webhook says whether it serves the
// eviction webhook.
func New(kube kubernetes.Interface, lb lifeboatclient.Interface, configs lifeboatinformers.LifeboatConfigInformer, leader string, webhook bool, log *slog.Logger) *Controller {
	return &Controller{kube: kube, lb: lb, configs: configs.Lister(), informer: configs.Informer(), leader: leader, webhook: webhook,
		interval: 5 * time.Minute, log: log.With("controller", "readiness")}
}

// Run writes the condition at once, again whenever the LifeboatConfig changes or five minutes have
// passed (the CRDs and the webhook's registration are read then), and Stopped when ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return nil
	}
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	reg, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke})
	if err != nil {
		return fmt.Errorf("readiness: %w", err)
	}
	defer func() { _ = c.informer.RemoveEventHandler(reg) }()
	tick := time.NewTicker(c.interval)
	defer tick.Stop()
	for {
		if err := c.write(ctx, c.decide(ctx)); err != nil && ctx.Err() == nil {
			c.log.Error("writing the Ready condition, will retry", "err", err)
		}
		select {
		case <-ctx.Done():
			// The next leader sets it again; a replica that crashes leaves it as it was, which
			// kubectl lifeboat check sees through (the Lease's renewals).
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := c.writeStopped(stopCtx); err != nil {
				c.log.Warn("could not leave Ready False on stopping", "err", err)
			}
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// decide reads the CRDs and the webhook's registration.
func (c *Controller) decide(ctx context.Context) metav1.Condition {
	in := Input{Leader: c.leader, Webhook: Webhook{Served: c.webhook}}
	for _, crd := range check.CRDs {
		raw, err := c.kube.CoreV1().RESTClient().Get().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd.Name).DoRaw(ctx)
		var got *apiextensionsv1.CustomResourceDefinition
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			in.CRDs = append(in.CRDs, check.Result{Check: "CRD " + crd.Name, Status: check.Unknown, Message: "cannot be read: " + err.Error()})
			continue
		default:
			got = &apiextensionsv1.CustomResourceDefinition{}
			if err := json.Unmarshal(raw, got); err != nil {
				in.CRDs = append(in.CRDs, check.Result{Check: "CRD " + crd.Name, Status: check.Unknown, Message: "cannot be read: " + err.Error()})
				continue
			}
		}
		in.CRDs = append(in.CRDs, check.CRD(crd.Name, got, crd.Type))
	}
	if c.webhook {
		hook, err := c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			in.Webhook.Registered, in.Webhook.Problem = Registration(nil)
		case err != nil:
			in.Webhook.Problem = "cannot read it: " + err.Error()
		default:
			in.Webhook.Registered, in.Webhook.Problem = Registration(hook)
		}
	}
	return Condition(in)
}

// writeStopped leaves Ready False (NoLeader) if the condition is still this replica's: a leader
// that lost its Lease never overwrites what the next one wrote.
func (c *Controller) writeStopped(ctx context.Context) error {
	cached, err := c.configs.Get(v1alpha1.ConfigName)
	if err != nil {
		return nil
	}
	if old := meta.FindStatusCondition(cached.Status.Conditions, v1alpha1.ConfigConditionReady); old == nil || !strings.HasPrefix(old.Message, "replica "+c.leader+" ") {
		return nil
	}
	return c.write(ctx, Stopped(c.leader, time.Now()))
}

// write sets the condition on the cached LifeboatConfig if it differs.
func (c *Controller) write(ctx context.Context, want metav1.Condition) error {
	cached, err := c.configs.Get(v1alpha1.ConfigName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if old := meta.FindStatusCondition(cached.Status.Conditions, want.Type); old != nil &&
		old.Status == want.Status && old.Reason == want.Reason && old.Message == want.Message && old.ObservedGeneration == cached.Generation {
		return nil
	}
	config := cached.DeepCopy()
	want.ObservedGeneration = config.Generation
	meta.SetStatusCondition(&config.Status.Conditions, want)
	_, err = c.lb.LifeboatV1alpha1().LifeboatConfigs().UpdateStatus(ctx, config, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		// A newer version comes through the informer, and with it another try.
		return nil
	}
	if err == nil {
		c.log.Info("Ready", "status", want.Status, "reason", want.Reason, "message", want.Message)
	}
	return err
}
