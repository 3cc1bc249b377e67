package evacuate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"strings"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	lifeboatlisters "github.com/lifeboat-vm/lifeboat/api/client/listers/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/internal/worker"
)

// Event reasons on VMIs.
const (
	ReasonMigrationCreated = "EvacuationMigrationCreated"
	ReasonLeftToExternal   = "EvacuationLeftToExternalController"
	ReasonFailedToMigrate  = "FailedCreateMigration"
	// ReasonAwaitingCapacity: no node took the VM's last target pod; lifeboat tries again when
	// the nodes or their free capacity change.
	ReasonAwaitingCapacity = "EvacuationAwaitingCapacity"
	// ReasonSlotGranted: a migration made ahead of a free slot got one and moves memory now.
	ReasonSlotGranted = "EvacuationSlotGranted"
	// ReasonWithdrawn: a migration made ahead went before it got a slot, its VMI no longer marked.
	ReasonWithdrawn = "EvacuationMigrationWithdrawn"
	// ReasonFollows: a migration made ahead, its target ready, takes the slot of one under way
	// when that one's transfer ends.
	ReasonFollows = "EvacuationFollows"
	globalKey     = "evacuations"
)

// Controller creates migrations for marked VMIs. The parallel limits are cluster-wide, so it
// decides for the whole cluster at once, from its caches, with one worker.
type Controller struct {
	lifeboat   lifeboatclient.Interface
	vmis       lifeboatlisters.VirtualMachineInstanceLister
	migrations lifeboatlisters.VirtualMachineInstanceMigrationLister
	configs    lifeboatlisters.LifeboatConfigLister
	nodes      corelisters.NodeLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	log        *slog.Logger
	now        func() time.Time

	// announced remembers the External marks and capacity waits already reported, so each gets
	// one Event.
	mu        sync.Mutex
	announced map[string]bool
	// capacityChanged is when a node or a bound pod last changed in a way that could make room.
	capacityChanged time.Time
	// unseen are the migrations this controller created or gave a slot that its cache does not
	// show so yet (namespace/name → when). Planning before they show would count too few running
	// migrations and overrun the parallel limits.
	unseen map[string]written
}

// written is a change to a migration this controller made: when, and whether it gave the
// migration a slot or another's to follow (else it created it).
type written struct {
	at      time.Time
	release bool
	follow  bool
}

// Waiting for the cache to show created migrations: how often to look, and how long before
// giving up on one (it may have been deleted at once).
const (
	cacheRecheck = 100 * time.Millisecond
	cacheMaxWait = 10 * time.Second
)

// New wires the controller to its informers; nodes and pods are NewCapacityInformers'.
func New(lb lifeboatclient.Interface, vmis lifeboatinformers.VirtualMachineInstanceInformer, migrations lifeboatinformers.VirtualMachineInstanceMigrationInformer,
	configs lifeboatinformers.LifeboatConfigInformer, nodes, pods cache.SharedIndexInformer, recorder record.EventRecorder, log *slog.Logger) *Controller {
	c := &Controller{
		lifeboat: lb, vmis: vmis.Lister(), migrations: migrations.Lister(), configs: configs.Lister(),
		synced: []cache.InformerSynced{vmis.Informer().HasSynced, migrations.Informer().HasSynced, configs.Informer().HasSynced,
			nodes.HasSynced, pods.HasSynced},
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "evacuation"}),
		recorder: recorder, log: log.With("controller", "evacuation"), now: time.Now,
		announced: map[string]bool{}, unseen: map[string]written{},
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.queue.Add(globalKey) },
		UpdateFunc: func(_, _ any) { c.queue.Add(globalKey) },
		DeleteFunc: func(any) { c.queue.Add(globalKey) },
	}
	for _, inf := range []cache.SharedIndexInformer{vmis.Informer(), migrations.Informer(), configs.Informer()} {
		_, _ = inf.AddEventHandler(handler)
	}
	// A new node (or the first list, after a restart), a node that accepts more, and a bound pod
	// that ends or goes may make room for a target pod that found none.
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.capacityChange() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && NodeMayTakeMore(o, n) {
				c.capacityChange()
			}
		},
		// A node gone may leave a VM nowhere to go (NoTargetNode).
		DeleteFunc: func(any) { c.queue.Add(globalKey) },
	})
	c.nodes = corelisters.NewNodeLister(nodes.GetIndexer())
	_, _ = pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Pod)
			p, ok2 := cur.(*corev1.Pod)
			if ok1 && ok2 && PodFreedCapacity(o, p, c.node(p.Spec.NodeName)) {
				c.capacityChange()
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok && DeletionFreedCapacity(p, c.node(p.Spec.NodeName)) {
				c.capacityChange()
			}
		},
	})
	return c
}

// node is the named node from the cache, nil if there is none.
func (c *Controller) node(name string) *corev1.Node {
	n, err := c.nodes.Get(name)
	if err != nil {
		return nil
	}
	return n
}

func (c *Controller) capacityChange() {
	c.mu.Lock()
	c.capacityChanged = c.now()
	c.mu.Unlock()
	c.queue.Add(globalKey)
}

// Run processes the queue until ctx ends, with one worker: the limits are cluster-wide.
func (c *Controller) Run(ctx context.Context) error {
	return worker.Run(ctx, "evacuation", c.queue, c.synced, 1, func(ctx context.Context, _ string) (time.Duration, error) {
		return c.sync(ctx)
	}, c.log)
}

func (c *Controller) sync(ctx context.Context) (time.Duration, error) {
	if c.awaitingCache() {
		return cacheRecheck, nil
	}
	vmis, err := c.vmis.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	migrations, err := c.migrations.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	config, err := c.configs.Get(v1alpha1.ConfigName)
	if err != nil {
		config = nil // no configuration: the defaults
	}
	// First what the nodes allow: a VM no other node can take is not migratable, and gets no
	// migration that could only wait for its pending timeout.
	vmis, err = c.place(ctx, vmis)
	errs := []error{err}
	c.mu.Lock()
	capacityChanged := c.capacityChanged
	c.mu.Unlock()
	d := Plan(vmis, migrations, config, capacityChanged, c.now())
	for _, vmi := range d.External {
		c.announceExternal(vmi)
	}
	for _, a := range d.AwaitingCapacity {
		c.announceAwaiting(a)
	}
	for _, m := range d.Withdraw {
		errs = append(errs, c.withdraw(ctx, m))
	}
	// A slot to one made ahead before a new one: the freed slot's place is the first.
	for _, m := range d.Release {
		errs = append(errs, c.release(ctx, m))
	}
	for _, f := range d.Follow {
		errs = append(errs, c.follow(ctx, f))
	}
	errs = append(errs, c.createAll(ctx, d.Create, false), c.createAll(ctx, d.Prepare, true))
	return d.RetryAfter, errors.Join(errs...)
}

// createAll makes the candidates' migrations side by side: one after another, each waiting for
// the API calls of those before it, the last of a drain's first round would start its target
// that much later, and its slot would stand idle meanwhile.
func (c *Controller) createAll(ctx context.Context, cands []Candidate, ahead bool) error {
	errs := make([]error, len(cands))
	var wg sync.WaitGroup
	for i, cand := range cands {
		wg.Go(func() { errs[i] = c.create(ctx, cand, ahead) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// create makes the migration and records its cause and deadline on it at once; ahead, it waits
// for a slot before it moves memory.
func (c *Controller) create(ctx context.Context, cand Candidate, ahead bool) error {
	vmi := cand.VMI
	m := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: vmi.Name + "-evacuation-",
			Namespace:    vmi.Namespace,
			Labels: map[string]string{
				v1alpha1.LabelVMIName: vmi.Name, v1alpha1.LabelVMIUID: string(vmi.UID), v1alpha1.LabelEvacuation: "true",
			},
			// The status is the migration controller's to write; these say what to record in it.
			Annotations:     map[string]string{v1alpha1.AnnotationCause: string(cand.Cause)},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))},
		},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}
	if cand.Deadline != nil {
		m.Annotations[v1alpha1.AnnotationDeadline] = cand.Deadline.UTC().Format(time.RFC3339)
	}
	if len(cand.FailedOn) > 0 {
		m.Annotations[v1alpha1.AnnotationPreferOtherNodes] = strings.Join(cand.FailedOn, ",")
	}
	created, err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(vmi.Namespace).Create(ctx, m, metav1.CreateOptions{})
	if err != nil {
		c.recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonFailedToMigrate, "creating its evacuation migration: %v", err)
		return fmt.Errorf("creating a migration for %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	msg := fmt.Sprintf("created migration %s (cause %s", created.Name, cand.Cause)
	if cand.Deadline != nil {
		msg += ", deadline " + cand.Deadline.UTC().Format(time.RFC3339)
	}
	if err := c.record(ctx, created, vmi, ahead); err != nil {
		// Unrecorded, it would pass for a person's migration: better none, and a retry.
		if derr := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(created.Namespace).Delete(ctx, created.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID}}); derr != nil && !apierrors.IsNotFound(derr) {
			err = errors.Join(err, fmt.Errorf("deleting it again: %w", derr))
		}
		c.recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonFailedToMigrate, "recording migration %s as its evacuation's: %v", created.Name, err)
		return fmt.Errorf("recording migration %s/%s as an evacuation's: %w", created.Namespace, created.Name, err)
	}
	c.mu.Lock()
	c.unseen[created.Namespace+"/"+created.Name] = written{at: c.now()}
	c.mu.Unlock()
	msg += ") to move the VM off node " + vmi.Status.NodeName
	if len(cand.FailedOn) > 0 {
		msg += "; its target prefers a node other than " + strings.Join(cand.FailedOn, ", ") + ", where earlier attempts failed"
	}
	if ahead {
		msg += "; it prepares its target now and moves memory once one of the parallel-migration slots frees"
	}
	c.recorder.Event(vmi, corev1.EventTypeNormal, ReasonMigrationCreated, msg)
	c.log.Info("created evacuation migration", "vmi", vmi.Namespace+"/"+vmi.Name, "migration", created.Name, "cause", cand.Cause, "deadline", cand.Deadline,
		"waitingForSlot", ahead, "preferOtherThan", cand.FailedOn)
	return nil
}

// release gives a migration made ahead its slot: its source agent may start moving memory.
func (c *Controller) release(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration) error {
	err := c.writeStatus(ctx, m, func(m *v1alpha1.VirtualMachineInstanceMigration) error {
		if m.Status.Evacuation == nil {
			return fmt.Errorf("migration %s has no evacuation record", m.Name)
		}
		m.Status.Evacuation.WaitingForSlot = false
		return nil
	})
	if apierrors.IsNotFound(err) {
		return nil // gone meanwhile: the next look counts without it
	}
	if err != nil {
		return fmt.Errorf("giving migration %s/%s its slot: %w", m.Namespace, m.Name, err)
	}
	c.mu.Lock()
	c.unseen[m.Namespace+"/"+m.Name] = written{at: c.now(), release: true}
	c.mu.Unlock()
	c.recorder.Eventf(m, corev1.EventTypeNormal, ReasonSlotGranted, "a parallel-migration slot freed on node %s: the migration moves memory once its target is ready", m.Status.SourceNode)
	c.log.Info("gave a migration made ahead its slot", "migration", m.Namespace+"/"+m.Name, "vmi", m.Spec.VMIName, "phase", m.Status.Phase)
	return nil
}

// follow has a migration made ahead take the slot of f.After when that one's transfer ends: its
// source agent starts it then. Written only over a migration still waiting and following none.
func (c *Controller) follow(ctx context.Context, f Follow) error {
	m := f.Migration
	err := c.writeStatus(ctx, m, func(m *v1alpha1.VirtualMachineInstanceMigration) error {
		if !m.WaitingForSlot() || m.SlotAfter() != "" {
			return errNothingToWrite
		}
		m.Status.Evacuation.SlotAfterUID = string(f.After.UID)
		return nil
	})
	if apierrors.IsNotFound(err) || errors.Is(err, errNothingToWrite) {
		return nil // gone, given a slot or following another meanwhile: the next look counts it so
	}
	if err != nil {
		return fmt.Errorf("having migration %s/%s follow %s/%s: %w", m.Namespace, m.Name, f.After.Namespace, f.After.Name, err)
	}
	c.mu.Lock()
	c.unseen[m.Namespace+"/"+m.Name] = written{at: c.now(), follow: true}
	c.mu.Unlock()
	c.recorder.Eventf(m, corev1.EventTypeNormal, ReasonFollows, "its target is ready: it takes the parallel-migration slot of migration %s/%s on node %s the moment that one's memory transfer ends",
		f.After.Namespace, f.After.Name, m.Status.SourceNode)
	c.log.Info("a migration made ahead follows one under way", "migration", m.Namespace+"/"+m.Name, "follows", f.After.Namespace+"/"+f.After.Name)
	return nil
}

// errNothingToWrite ends a status write whose change no longer applies to the migration as it is.
var errNothingToWrite = errors.New("nothing to write")

// withdraw deletes a migration made ahead whose VMI is no longer marked: it moved nothing, and
// the migration controller deletes its target pod as it goes.
func (c *Controller) withdraw(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration) error {
	err := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(m.Namespace).Delete(ctx, m.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &m.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("withdrawing migration %s/%s: %w", m.Namespace, m.Name, err)
	}
	c.recorder.Eventf(m, corev1.EventTypeNormal, ReasonWithdrawn, "VMI %s is no longer marked for evacuation; the migration made ahead goes before it moved any memory", m.Spec.VMIName)
	c.log.Info("withdrew a migration made ahead", "migration", m.Namespace+"/"+m.Name, "vmi", m.Spec.VMIName)
	return nil
}

// record writes, in the new migration's status, that this controller made it to evacuate vmi:
// status is what no tenant can write, so this is what tells the migrations that count against
// the evacuation limits from anyone else's. The migration controller may write the status first.
func (c *Controller) record(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, ahead bool) error {
	return c.writeStatus(ctx, m, func(m *v1alpha1.VirtualMachineInstanceMigration) error {
		m.Status.Evacuation = &v1alpha1.MigrationEvacuation{VMIUID: string(vmi.UID), WaitingForSlot: ahead}
		return nil
	})
}

// writeStatus writes m's status as change makes it, reading the migration again on a conflict;
// it fails if the migration was replaced (another UID) meanwhile.
func (c *Controller) writeStatus(ctx context.Context, m *v1alpha1.VirtualMachineInstanceMigration, change func(*v1alpha1.VirtualMachineInstanceMigration) error) error {
	client := c.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(m.Namespace)
	m = m.DeepCopy()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := change(m); err != nil {
			return err
		}
		_, err := client.UpdateStatus(ctx, m, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := client.Get(ctx, m.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			if fresh.UID != m.UID {
				return fmt.Errorf("migration %s was replaced", m.Name)
			}
			m = fresh
		}
		return err
	})
}

// awaitingCache reports whether a migration this controller created is not in its cache yet
// with its record, or one it gave a slot does not show it yet: it would count against the wrong
// limits.
func (c *Controller) awaitingCache() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, w := range c.unseen {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		m, err := c.migrations.VirtualMachineInstanceMigrations(ns).Get(name)
		shows := err == nil && m.EvacuatedVMI() != "" && (!w.release || !m.WaitingForSlot()) && (!w.follow || !m.WaitingForSlot() || m.SlotAfter() != "")
		if shows || apierrors.IsNotFound(err) && (w.release || w.follow) || c.now().Sub(w.at) > cacheMaxWait {
			delete(c.unseen, key)
		}
	}
	return len(c.unseen) > 0
}

// announceExternal tells, once per mark, that lifeboat leaves this VMI to an external controller.
func (c *Controller) announceExternal(vmi *v1alpha1.VirtualMachineInstance) {
	if c.firstTime(string(vmi.UID) + "/" + candidate(vmi).markedAt.String()) {
		c.recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonLeftToExternal,
			"marked for evacuation from node %s; its eviction strategy is External, so lifeboat leaves the move to the external controller", vmi.Status.NodeName)
	}
}

// announceAwaiting tells, once per failed migration, that the VM waits for room on another node.
func (c *Controller) announceAwaiting(a Awaiting) {
	if !c.firstTime(string(a.Failed.UID)) {
		return
	}
	msg := fmt.Sprintf("no node took the target pod of migration %s (%s); the VM stays on node %s and lifeboat tries again when a node is added or changes, or a pod ends",
		a.Failed.Name, a.Failed.Status.FailureReason, a.VMI.Status.NodeName)
	c.recorder.Event(a.VMI, corev1.EventTypeWarning, ReasonAwaitingCapacity, msg)
	c.log.Info("evacuation awaits capacity", "vmi", a.VMI.Namespace+"/"+a.VMI.Name, "failedMigration", a.Failed.Name)
}

// firstTime reports whether key is announced for the first time, and remembers it.
func (c *Controller) firstTime(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.announced[key]
	c.announced[key] = true
	return !seen
}
