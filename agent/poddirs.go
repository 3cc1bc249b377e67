package agent

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A launcher keeps its files (its libvirtd's state and socket, the guest's console log) in
// its pod's run volume, an emptyDir: only that pod sees them, and they go with the pod. The
// agent reaches that volume through the kubelet's pod directory, and links it as
// DomainsDir/<vmi-uid>, short enough for unix socket addresses. (In the pod it is
// api/launcher PodRunDir.) The agent serves the launcher's notify socket
// in the same volume, so whoever connects there is that VM's launcher.

// LinkedPod picks, among the launcher pods of one VMI on this node, the one whose run
// volume is the VMI's directory: the newest whose containers may still run, or, when all
// ended, the newest (its files stay until it is deleted, as an emptyDir's do). ok is false
// when there is no pod.
func LinkedPod(pods []*corev1.Pod) (pod *corev1.Pod, ok bool) {
	ended := func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}
	for _, p := range pods {
		if pod == nil || ended(pod) && !ended(p) || ended(pod) == ended(p) && pod.CreationTimestamp.Before(&p.CreationTimestamp) {
			pod = p
		}
	}
	return pod, pod != nil
}

// linkedPod is LinkedPod among the pods of the PodInformer that run the VMI with uid on this node.
func (a *Agent) linkedPod(uid string) (*corev1.Pod, bool) {
	var pods []*corev1.Pod
	for _, obj := range a.cfg.PodInformer.GetStore().List() {
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[v1alpha1.LabelVMIUID] == uid && p.Spec.NodeName == a.cfg.NodeName {
			pods = append(pods, p)
		}
	}
	return LinkedPod(pods)
}

// podHasDevice says whether this node's pod namespace/name asks for the device resource: the
// kubelet runs a pod only with the devices it asks for allocated.
func (a *Agent) podHasDevice(namespace, name string, resource corev1.ResourceName) bool {
	if a.cfg.PodInformer == nil {
		return false
	}
	obj, ok, err := a.cfg.PodInformer.GetStore().GetByKey(namespace + "/" + name)
	p, isPod := obj.(*corev1.Pod)
	if err != nil || !ok || !isPod || p.Spec.NodeName != a.cfg.NodeName {
		return false
	}
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[resource]; ok && !q.IsZero() {
			return true
		}
	}
	return false
}

// podDirs keeps DomainsDir's links and the notify sockets in step with the pod informer.
type podDirs struct {
	a *Agent
	// syncing serialises sync: the informer's handlers and the resync both call it.
	syncing sync.Mutex
	mu      sync.Mutex
	notify  map[string]*notifyServing // by VMI UID: the notify socket served in its directory
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
// resync: a pod's volume may appear after the pod's last event reached the agent.
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
	uids := map[string]bool{}
	for _, obj := range d.a.cfg.PodInformer.GetStore().List() {
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[v1alpha1.LabelVMIUID] != "" {
			uids[p.Labels[v1alpha1.LabelVMIUID]] = true
		}
	}
	entries, _ := os.ReadDir(d.a.cfg.DomainsDir)
	for _, e := range entries {
		uids[e.Name()] = true
	}
	for uid := range uids {
		d.sync(ctx, uid)
	}
}

// sync links the VMI's directory to the run volume of its linked pod, and serves the
// notify socket there; with no pod, it removes both.
func (d *podDirs) sync(ctx context.Context, uid string) {
	d.syncing.Lock()
	defer d.syncing.Unlock()
	log := d.a.cfg.Log.With("vmiUID", uid)
	link := filepath.Join(d.a.cfg.DomainsDir, uid)
	pod, ok := d.a.linkedPod(uid)
	if !ok {
		d.stopNotify(uid)
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
	if current, _ := os.Readlink(link); current == target {
		d.ensureNotify(ctx, uid, link)
		return
	}
	// The kubelet makes the volume before the pod's containers start; until then, wait.
	if _, err := os.Stat(target); err != nil {
		return
	}
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
	log.Info("linked the launcher pod's run volume", "pod", pod.Namespace+"/"+pod.Name, "dir", link)
	d.stopNotify(uid)
	d.ensureNotify(ctx, uid, link)
}

// ensureNotify serves the notify socket in dir for the VMI, unless it is served already.
func (d *podDirs) ensureNotify(ctx context.Context, uid, dir string) {
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
		if err := d.a.cfg.ServeNotify(nctx, path, uid); err != nil {
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
