package agent

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// A launcher keeps its files (its libvirtd's state and socket, the guest's console log) in
// its pod's run volume, an emptyDir: only that pod sees them, and they go with the pod. The
// agent reaches that volume through the kubelet's pod directory, and links it as
// DomainsDir/<vmi-uid>, short enough for unix socket addresses. (In the pod it is
// api/launcher PodRunDir.) The agent serves the launcher's notify socket in the same volume,
// dials the launcher's libvirt there, and a migration's target proxies forward into it, so the
// link decides which pod speaks for the VM: only the pod lifeboat's controller recorded.

// RecordedPod is a launcher pod lifeboat's controller recorded for a VMI, in status that
// tenants cannot write: the VMI's status.launcherPod, or a migration's status.targetPod and
// targetPodUID. Its namespace is the VMI's.
type RecordedPod struct {
	Namespace, Name string
	UID             types.UID
}

// Link is what LinkPod decided for one VMI's directory on this node.
type Link struct {
	// Pod is the pod whose run volume the directory links to; nil for no link.
	Pod *corev1.Pod
	// Impostors are pods that claim the VM by their labels but are not its launcher: the VMI
	// does not control them, or they are in another namespace than the pods recorded for it.
	Impostors []*corev1.Pod
}

// LinkPod decides which of the pods on this node that claim the VMI with vmiUID (by label, or
// because they were recorded for it) its directory links to. Only a pod recorded for the VMI
// (namespace, name and UID) that the VMI controls is its launcher; labels, names and owner
// references alone are anyone's to set. Of several (a migration's target that failed here and a
// new one), the newest whose containers may still run, or when all ended the newest: its files
// stay until it is deleted, as an emptyDir's do.
//
// current is the pod the directory links to now, when this agent linked it and it still exists;
// held says its launcher is connected, which it is throughout a migration. A held link is never
// re-pointed, and a link whose pod is no longer recorded (a source whose guest has left, once
// the VMI names the target) stays until the pod goes, unless a recorded pod needs the place.
func LinkPod(vmiUID types.UID, recorded []RecordedPod, claiming []*corev1.Pod, current *corev1.Pod, held bool) Link {
	controlled := func(p *corev1.Pod) bool {
		ref := v1alpha1.VMIController(p)
		return ref != nil && ref.UID == vmiUID
	}
	isRecorded := func(p *corev1.Pod) bool {
		return slices.ContainsFunc(recorded, func(r RecordedPod) bool {
			return r.Namespace == p.Namespace && r.Name == p.Name && r.UID == p.UID
		})
	}
	inNamespace := func(p *corev1.Pod) bool {
		return slices.ContainsFunc(recorded, func(r RecordedPod) bool { return r.Namespace == p.Namespace })
	}
	ended := func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}
	var link Link
	for _, p := range claiming {
		if !isRecorded(p) || !controlled(p) {
			continue
		}
		if pod := link.Pod; pod == nil || ended(pod) && !ended(p) || ended(pod) == ended(p) && pod.CreationTimestamp.Before(&p.CreationTimestamp) {
			link.Pod = p
		}
	}
	if current != nil && controlled(current) && (link.Pod == nil || held && link.Pod.UID != current.UID) {
		link.Pod = current
	}
	for _, p := range claiming {
		switch {
		case link.Pod != nil && p.UID == link.Pod.UID, isRecorded(p) && controlled(p):
		case !controlled(p), len(recorded) > 0 && !inNamespace(p):
			link.Impostors = append(link.Impostors, p)
		}
	}
	return link
}

// recordedPods are the launcher pods on this node that lifeboat's controller recorded for the
// VMI with uid: its own while it runs here, and the targets of migrations reaching this node.
func (a *Agent) recordedPods(uid string) []RecordedPod {
	var recorded []RecordedPod
	if vmi := a.cachedVMI(uid); vmi != nil && vmi.Status.LauncherPod != nil {
		recorded = append(recorded, RecordedPod{Namespace: vmi.Namespace, Name: vmi.Status.LauncherPod.Name, UID: vmi.Status.LauncherPod.UID})
	}
	for _, lister := range a.migrations.listers {
		migs, _ := lister.List(labels.Everything())
		for _, mig := range migs {
			if mig.Status.TargetNode != a.cfg.NodeName || mig.Status.TargetPodUID == "" || mig.Status.Phase == v1alpha1.MigrationFailed || mig.DeletionTimestamp != nil {
				continue
			}
			// The migration names its VMI by name; the recorded pod, found by its recorded
			// name and UID, says by its controller which VMI UID that is.
			p := a.podByKey(mig.Namespace, mig.Status.TargetPod)
			if p == nil || p.UID != mig.Status.TargetPodUID {
				continue
			}
			if ref := v1alpha1.VMIController(p); ref != nil && string(ref.UID) == uid && ref.Name == mig.Spec.VMIName {
				recorded = append(recorded, RecordedPod{Namespace: mig.Namespace, Name: mig.Status.TargetPod, UID: mig.Status.TargetPodUID})
			}
		}
	}
	return recorded
}

// claimingPods are this node's pods labelled as the launcher of the VMI with uid, and the pods
// recorded for it whatever their labels.
func (a *Agent) claimingPods(uid string, recorded []RecordedPod) []*corev1.Pod {
	var pods []*corev1.Pod
	for _, obj := range a.cfg.PodInformer.GetStore().List() {
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[v1alpha1.LabelVMIUID] == uid && p.Spec.NodeName == a.cfg.NodeName {
			pods = append(pods, p)
		}
	}
	for _, r := range recorded {
		if p := a.podByKey(r.Namespace, r.Name); p != nil && p.UID == r.UID && !slices.Contains(pods, p) {
			pods = append(pods, p)
		}
	}
	return pods
}

// podByKey is this node's pod namespace/name from the pod informer, nil if it has none.
func (a *Agent) podByKey(namespace, name string) *corev1.Pod {
	obj, ok, err := a.cfg.PodInformer.GetStore().GetByKey(namespace + "/" + name)
	if p, isPod := obj.(*corev1.Pod); err == nil && ok && isPod && p.Spec.NodeName == a.cfg.NodeName {
		return p
	}
	return nil
}

// setLink records the pod the VMI's directory links to; nil for none.
func (a *Agent) setLink(uid string, p *corev1.Pod) {
	connected := a.conn(uid) != nil
	a.linksMu.Lock()
	defer a.linksMu.Unlock()
	if p == nil {
		if r, ok := a.links[uid]; ok && connected {
			a.unlinked[uid] = r
		}
		delete(a.links, uid)
		return
	}
	delete(a.unlinked, uid)
	a.links[uid] = RecordedPod{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// linkedPod is the pod this agent linked the directory of the VMI with uid to, if it still exists.
func (a *Agent) linkedPod(uid string) (*corev1.Pod, bool) {
	if a.cfg.PodInformer == nil {
		return nil, false
	}
	a.linksMu.Lock()
	r, ok := a.links[uid]
	a.linksMu.Unlock()
	if !ok {
		return nil, false
	}
	p := a.podByKey(r.Namespace, r.Name)
	return p, p != nil && p.UID == r.UID
}

// podHasDevice says whether this node's pod namespace/name asks for the device resource: the
// kubelet runs a pod only with the devices it asks for allocated.
func (a *Agent) podHasDevice(namespace, name string, resource corev1.ResourceName) bool {
	if a.cfg.PodInformer == nil {
		return false
	}
	p := a.podByKey(namespace, name)
	if p == nil {
		return false
	}
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[resource]; ok && !q.IsZero() {
			return true
		}
	}
	return false
}

// podDirs keeps DomainsDir's links and the notify sockets in step with the pods lifeboat's
// controller recorded.
type podDirs struct {
	a *Agent
	// syncing serialises sync: the informers' handlers and the resync call it. impostors holds
	// the UIDs of the pods refused as impostors, so that each is counted and logged once.
	syncing   sync.Mutex
	impostors map[types.UID]bool
	mu        sync.Mutex
	notify    map[string]*notifyServing // by VMI UID: the notify socket served in its directory
	// volumeWaits are the VMIs whose pod to link has no run volume yet, by VMI UID (lookAgain).
	volumeWaits map[string]*volumeWait
}

// A pod's run volume is made by its kubelet after the pod reached the node and before its
// containers start, and no pod event marks it. The agent looks for it again after
// firstVolumeLook, then twice as long each time up to lastVolumeLook, so that the notify socket
// is there as the launcher starts (it asks for QEMU's capabilities first thing) rather than after
// the pod's next status update.
const (
	firstVolumeLook = 20 * time.Millisecond
	lastVolumeLook  = time.Second
)

// volumeWait is the next look for a pod's run volume.
type volumeWait struct {
	after time.Duration
	timer *time.Timer // nil between looks
}

type notifyServing struct {
	stop context.CancelFunc
	done chan struct{} // closed once the server has closed its socket
}

// runVolume is the launcher pod's run volume as the agent sees it.
func (d *podDirs) runVolume(podUID string) string {
	return filepath.Join(d.a.cfg.KubeletPodsDir, podUID, "volumes", "kubernetes.io~empty-dir", contract.RunVolume)
}

// run syncs the VMI's directory whenever one of its pods changes, and all of them every
// resync: links of pods deleted while the agent was down go then.
func (d *podDirs) run(ctx context.Context, resync time.Duration) {
	enqueue := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[v1alpha1.LabelVMIUID] != "" {
			d.sync(ctx, p.Labels[v1alpha1.LabelVMIUID])
		}
	}
	reg, err := d.a.cfg.PodInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	})
	if err != nil {
		d.a.cfg.Log.Error("watching launcher pods for their directories", "err", err)
		return
	}
	defer func() { _ = d.a.cfg.PodInformer.RemoveEventHandler(reg) }()
	// A record written after the pod reached this node links it at once, not at the resync.
	onRecord := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { d.syncAll(ctx) }, UpdateFunc: func(_, _ any) { d.syncAll(ctx) },
	}
	for _, informer := range d.a.migrations.informers {
		if reg, err := informer.AddEventHandler(onRecord); err == nil {
			defer func() { _ = informer.RemoveEventHandler(reg) }()
		}
	}
	if reg, err := d.a.informer.AddEventHandler(onRecord); err == nil {
		defer func() { _ = d.a.informer.RemoveEventHandler(reg) }()
	}
	wait.UntilWithContext(ctx, d.syncAll, resync)
	d.mu.Lock()
	for _, n := range d.notify {
		n.stop()
	}
	d.mu.Unlock()
}

// syncAll syncs the directory of every VMI with a pod or a link here, so that links of pods
// deleted while the agent was down go too.
func (d *podDirs) syncAll(ctx context.Context) {
	uids, pods := map[string]bool{}, map[types.UID]bool{}
	for _, obj := range d.a.cfg.PodInformer.GetStore().List() {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			continue
		}
		pods[p.UID] = true
		if p.Labels[v1alpha1.LabelVMIUID] != "" {
			uids[p.Labels[v1alpha1.LabelVMIUID]] = true
		}
		if ref := v1alpha1.VMIController(p); ref != nil {
			uids[string(ref.UID)] = true
		}
	}
	for _, obj := range d.a.informer.GetStore().List() {
		uids[string(obj.(metav1.Object).GetUID())] = true
	}
	entries, _ := os.ReadDir(d.a.cfg.DomainsDir)
	for _, e := range entries {
		uids[e.Name()] = true
	}
	for uid := range uids {
		d.sync(ctx, uid)
	}
	d.syncing.Lock()
	for uid := range d.impostors {
		if !pods[uid] {
			delete(d.impostors, uid)
		}
	}
	d.syncing.Unlock()
}

// sync links the VMI's directory to the run volume of the pod LinkPod decides on, and serves
// the notify socket there; with no pod, it removes both.
func (d *podDirs) sync(ctx context.Context, uid string) {
	d.syncing.Lock()
	defer d.syncing.Unlock()
	log := d.a.cfg.Log.With("vmiUID", uid)
	link := filepath.Join(d.a.cfg.DomainsDir, uid)
	recorded := d.a.recordedPods(uid)
	claiming := d.a.claimingPods(uid, recorded)
	current, _ := d.a.linkedPod(uid)
	linkedTo, _ := os.Readlink(link)
	if current != nil && linkedTo != d.runVolume(string(current.UID)) {
		current = nil
	}
	decision := LinkPod(types.UID(uid), recorded, claiming, current, d.a.connected(uid))
	for _, p := range decision.Impostors {
		if !d.impostors[p.UID] {
			d.impostors[p.UID] = true
			d.a.cfg.Metrics.LauncherImpostors.Inc()
			log.Warn("refused a pod that claims to be a VM's launcher: lifeboat's controller did not record it for the VMI",
				"pod", p.Namespace+"/"+p.Name, "podUID", p.UID, "recorded", recorded)
		}
	}
	pod := decision.Pod
	if pod == nil {
		d.stopLooking(uid)
		d.stopNotify(uid)
		d.a.setLink(uid, nil)
		if fi, err := os.Lstat(link); err == nil && fi.Mode().Type() == fs.ModeSymlink {
			if err := os.Remove(link); err != nil {
				log.Warn("removing the directory link of a VMI whose pods are gone", "err", err)
				return
			}
			d.a.cfg.Metrics.LauncherDirsRemoved.Inc()
			log.Info("removed the directory link of a VMI whose launcher pods are gone from this node")
		}
		return
	}
	target := d.runVolume(string(pod.UID))
	if linkedTo == target {
		d.stopLooking(uid)
		d.a.setLink(uid, pod)
		d.ensureNotify(ctx, d.a.vmiRef(uid, pod), link)
		return
	}
	if _, err := os.Stat(target); err != nil {
		d.lookAgain(ctx, uid)
		return
	}
	d.stopLooking(uid)
	// Replaced in one rename, so that the directory never seems gone in between; made beside
	// DomainsDir, where the discovery does not take it for a launcher.
	tmp := filepath.Join(filepath.Dir(d.a.cfg.DomainsDir), ".link-"+uid)
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		log.Warn("linking a launcher's run volume", "pod", pod.Name, "err", err)
		return
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		log.Warn("linking a launcher's run volume", "pod", pod.Name, "err", err)
		return
	}
	d.a.setLink(uid, pod)
	log.Info("linked the launcher pod's run volume", "pod", pod.Namespace+"/"+pod.Name, "podUID", pod.UID, "dir", link)
	d.stopNotify(uid)
	d.ensureNotify(ctx, d.a.vmiRef(uid, pod), link)
}

// lookAgain syncs the VMI's directory again after the next wait of its volumeWait, unless a look
// is set already.
func (d *podDirs) lookAgain(ctx context.Context, uid string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.volumeWaits[uid]
	if w == nil {
		w = &volumeWait{after: firstVolumeLook}
		d.volumeWaits[uid] = w
	}
	if w.timer != nil {
		return
	}
	w.timer = time.AfterFunc(w.after, func() {
		d.mu.Lock()
		w.timer = nil
		d.mu.Unlock()
		if ctx.Err() == nil {
			d.sync(ctx, uid)
		}
	})
	w.after = min(2*w.after, lastVolumeLook)
}

// stopLooking ends the VMI's looks for a run volume: it is linked, or there is nothing to link.
func (d *podDirs) stopLooking(uid string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.volumeWaits[uid]; w != nil {
		if w.timer != nil {
			w.timer.Stop()
		}
		delete(d.volumeWaits, uid)
	}
}

// vmiRef names the VMI with uid whose directory links to pod, its launcher: LinkPod links only a
// pod the VMI controls, in the namespace lifeboat recorded it in. The name is the VMI's as this
// node's informer holds it, or, for a migration's target (whose VMI runs on another node), the
// controller's reference of the pod, which recordedPods matched to the migration's VMI.
func (a *Agent) vmiRef(uid string, pod *corev1.Pod) notify.VMIRef {
	ref := notify.VMIRef{Namespace: pod.Namespace, UID: uid}
	if vmi := a.cachedVMI(uid); vmi != nil {
		ref.Namespace, ref.Name = vmi.Namespace, vmi.Name
	} else if owner := v1alpha1.VMIController(pod); owner != nil {
		ref.Name = owner.Name
	}
	return ref
}

// ensureNotify serves the notify socket in dir for the VMI, unless it is served already.
func (d *podDirs) ensureNotify(ctx context.Context, vmi notify.VMIRef, dir string) {
	uid := vmi.UID
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.notify[uid]; ok || d.a.cfg.ServeNotify == nil {
		return
	}
	nctx, cancel := context.WithCancel(ctx)
	serving := &notifyServing{stop: cancel, done: make(chan struct{})}
	d.notify[uid] = serving
	path := filepath.Join(dir, contract.NotifySocketName)
	go func() {
		defer close(serving.done)
		defer cancel()
		if err := d.a.cfg.ServeNotify(nctx, path, vmi); err != nil {
			d.a.cfg.Log.Warn("serving a launcher's notify socket", "vmiUID", uid, "socket", path, "err", err)
		}
		// Served again at the next sync, unless it was stopped on purpose.
		d.mu.Lock()
		if d.notify[uid] == serving {
			delete(d.notify, uid)
		}
		d.mu.Unlock()
	}()
}

// stopNotify stops the VMI's notify server and waits until its socket is closed, so that a
// server started next at the same path never has its socket removed by this one.
func (d *podDirs) stopNotify(uid string) {
	d.mu.Lock()
	n, ok := d.notify[uid]
	delete(d.notify, uid)
	d.mu.Unlock()
	if ok {
		n.stop()
		<-n.done
	}
}
