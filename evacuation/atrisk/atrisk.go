// Package atrisk gathers what each node's agent published of its kubelet's eviction settings (the
// Node annotation lifeboat.dev/eviction-exposure) into the LifeboatConfig's VMsAtRisk condition:
// one writer for the condition, each agent the only writer of its node's annotation.
package atrisk

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// Condition reasons of VMsAtRisk.
const (
	ReasonNodesAtRisk  = "NodesAtRisk"
	ReasonNoNodeAtRisk = "NoNodeAtRisk"
)

// Controller keeps the LifeboatConfig's VMsAtRisk condition.
type Controller struct {
	lb      lifeboatclient.Interface
	nodes   cache.Store
	configs lifeboatlisters.LifeboatConfigLister
	synced  []cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
	log     *slog.Logger
}

// New makes the controller; nodes is an informer of every Node.
func New(lb lifeboatclient.Interface, nodes cache.SharedIndexInformer, configs lifeboatinformers.LifeboatConfigInformer, log *slog.Logger) *Controller {
	c := &Controller{
		lb: lb, nodes: nodes.GetStore(), configs: configs.Lister(),
		synced: []cache.InformerSynced{nodes.HasSynced, configs.Informer().HasSynced},
		queue:  workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "atrisk"}),
		log:    log.With("controller", "atrisk"),
	}
	// One key: every change of a node's exposure, or of the configuration, recomputes the condition.
	enqueue := func(any) { c.queue.Add(v1alpha1.ConfigName) }
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, DeleteFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || o.Annotations[v1alpha1.AnnotationEvictionExposure] != n.Annotations[v1alpha1.AnnotationEvictionExposure] {
				enqueue(cur)
			}
		},
	})
	_, _ = configs.Informer().AddEventHandler(worker.Handler(enqueue))
	return c
}

// Run processes the queue until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	return worker.Run(ctx, "atrisk", c.queue, c.synced, 1, func(ctx context.Context, _ string) (time.Duration, error) {
		return 0, c.sync(ctx)
	}, c.log)
}

func (c *Controller) sync(ctx context.Context) error {
	cached, err := c.configs.Get(v1alpha1.ConfigName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	exposures := map[string]v1alpha1.NodeEvictionExposure{}
	for _, obj := range c.nodes.List() {
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		value, ok := n.Annotations[v1alpha1.AnnotationEvictionExposure]
		if !ok {
			continue
		}
		var e v1alpha1.NodeEvictionExposure
		if err := json.Unmarshal([]byte(value), &e); err != nil {
			c.log.Warn("a node's eviction exposure annotation is not what an agent writes", "node", n.Name, "err", err)
			continue
		}
		exposures[n.Name] = e
	}
	cond := Condition(exposures)
	if old := meta.FindStatusCondition(cached.Status.Conditions, cond.Type); old != nil &&
		old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message && old.ObservedGeneration == cached.Generation {
		return nil
	}
	config := cached.DeepCopy()
	cond.ObservedGeneration = config.Generation
	meta.SetStatusCondition(&config.Status.Conditions, cond)
	if _, err := c.lb.LifeboatV1alpha1().LifeboatConfigs().UpdateStatus(ctx, config, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the %s condition: %w", cond.Type, err)
	}
	c.log.Info("VMs at risk", "status", cond.Status, "message", cond.Message)
	return nil
}

// maxNamed is how many nodes the condition's message names, so that it stays short on a large
// cluster; the count says how many there are.
const maxNamed = 10

// Condition is VMsAtRisk for the nodes' published exposures, by node name: True naming the nodes
// whose agents found a VM that neither the kubelet's grace nor relief can save, with the first
// one's reason.
func Condition(exposures map[string]v1alpha1.NodeEvictionExposure) metav1.Condition {
	var names []string
	for name, e := range exposures {
		if e.AtRisk {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return metav1.Condition{Type: v1alpha1.ConfigConditionVMsAtRisk, Status: metav1.ConditionFalse, Reason: ReasonNoNodeAtRisk,
			Message: fmt.Sprintf("on each of the %d nodes that reported, the kubelet's eviction grace or node-pressure relief can save every VM", len(exposures))}
	}
	named := names[:min(len(names), maxNamed)]
	more := ""
	if len(names) > maxNamed {
		more = fmt.Sprintf(" and %d more", len(names)-maxNamed)
	}
	return metav1.Condition{Type: v1alpha1.ConfigConditionVMsAtRisk, Status: metav1.ConditionTrue, Reason: ReasonNodesAtRisk,
		Message: fmt.Sprintf("%d node(s) have VMs that neither the kubelet's eviction grace nor node-pressure relief can save from memory pressure: %s%s. On %s: %s",
			len(names), strings.Join(named, ", "), more, names[0], exposures[names[0]].Message)}
}
