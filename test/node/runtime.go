package node

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// runtimeName prefixes container IDs and names the container runtime in the Node's status.
const runtimeName = "lifeboat-node"

// podRuntime runs the containers of a node's pods as processes and keeps, for each pod, what
// the kubelet's pod workers know: container states, the sandbox, a stop in progress.
type podRuntime struct {
	nodeName string
	layout   layout
	binaries map[string]string
	address  string
	// devices are the host devices of extended resources (Config.Devices).
	devices map[corev1.ResourceName]string
	// cpuGroup is the cpu cgroup containers run in (Config.PodCPUShares); "" for the node's.
	cpuGroup string
	// network wires the pods that are not on the host's network; nil puts every pod there.
	network  *nodeNetwork
	recorder record.EventRecorder
	logger   klog.Logger
	// changed is called when a container exits, so that its pod's status is written again.
	changed func(key string)

	mu      sync.Mutex
	records map[string]*podRecord // by namespace/name

	liveMu sync.Mutex
	live   map[*process]struct{}
}

func podKey(pod *corev1.Pod) string { return cache.MetaObjectToName(pod).String() }

// podString names a pod as the kubelet does in messages (format.Pod).
func podString(pod *corev1.Pod) string {
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}

// record returns the record of pod, creating it if the node has none. A record of an earlier
// pod of the same name (one force-deleted and replaced) is dropped and its processes stopped.
func (r *podRuntime) record(pod *corev1.Pod, now time.Time) *podRecord {
	key := podKey(pod)
	r.mu.Lock()
	old := r.records[key]
	if old != nil && old.uid == pod.UID {
		r.mu.Unlock()
		return old
	}
	rec := &podRecord{key: key, uid: pod.UID, containers: map[string]*containerRecord{}}
	for _, s := range adoptedStatuses(pod) {
		rec.containers[s.Name] = &containerRecord{status: s}
	}
	r.records[key] = rec
	r.mu.Unlock()
	if old != nil {
		r.stop(nil, old, lostPodGracePeriod, now)
	}
	return rec
}

// forget drops the record of a pod that has left the API server and stops what still runs for it.
func (r *podRuntime) forget(key string, now time.Time) {
	r.mu.Lock()
	rec := r.records[key]
	delete(r.records, key)
	r.mu.Unlock()
	if rec != nil {
		r.stop(nil, rec, lostPodGracePeriod, now)
		go r.releaseNetwork(rec)
	}
}

// releaseNetwork tears the pod's network down once nothing of it runs, as a runtime removes
// a sandbox.
func (r *podRuntime) releaseNetwork(rec *podRecord) {
	rec.mu.Lock()
	sb := rec.sandboxNet
	var procs []*process
	for _, cr := range rec.containers {
		if cr.proc != nil {
			procs = append(procs, cr.proc)
		}
	}
	rec.sandboxNet = nil
	rec.mu.Unlock()
	if sb == nil || r.network == nil {
		return
	}
	for _, p := range procs {
		<-p.done
	}
	if err := r.network.detach(context.Background(), sb); err != nil {
		r.logger.Error(err, "Tearing down a pod's network", "pod", rec.key)
	}
}

// startDue starts the containers of pod never created yet and restarts those whose restart
// policy and back-off say so. It returns how long until the next restart falls due (0 if none
// is pending), and an error if a container's volumes could not be prepared.
func (r *podRuntime) startDue(pod *corev1.Pod, rec *podRecord, now time.Time) (time.Duration, error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var next time.Duration
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if cr := rec.containers[c.Name]; cr != nil {
			if cr.proc != nil {
				continue
			}
			restart, at := nextRestart(pod.Spec.RestartPolicy, cr.status)
			if !restart {
				continue
			}
			if wait := at.Sub(now); wait > 0 {
				r.backOff(pod, cr)
				if next == 0 || wait < next {
					next = wait
				}
				continue
			}
		}
		if err := r.startContainer(pod, rec, c, now); err != nil {
			return next, err
		}
	}
	return next, nil
}

// backOff shows a container waiting out its restart back-off, as the kubelet reports it.
func (r *podRuntime) backOff(pod *corev1.Pod, cr *containerRecord) {
	if cr.status.State.Waiting != nil {
		return
	}
	cr.status.LastTerminationState = cr.status.State
	cr.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: reasonCrashLoopBackOff,
		Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s",
			restartBackOff(cr.status.RestartCount), cr.status.Name, podString(pod)),
	}}
	r.recorder.Eventf(pod, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s", cr.status.Name, podString(pod))
}

// startContainer creates container c of pod, or creates it again. Problems with the
// container's configuration or command end up in its status, as with a real runtime; only a
// volume that cannot be prepared is an error, to be retried.
func (r *podRuntime) startContainer(pod *corev1.Pod, rec *podRecord, c *corev1.Container, now time.Time) error {
	status := corev1.ContainerStatus{Name: c.Name, Image: c.Image}
	if cr := rec.containers[c.Name]; cr != nil {
		status.RestartCount = cr.status.RestartCount + 1
		status.LastTerminationState = cr.status.State
		if cr.status.State.Waiting != nil {
			status.LastTerminationState = cr.status.LastTerminationState
		}
	}
	// The kubelet mounts volumes before it creates the sandbox, and creates the sandbox
	// before it reads a container's configuration.
	if err := prepareVolumes(r.layout, pod, c); err != nil {
		r.recorder.Eventf(pod, corev1.EventTypeWarning, "FailedMount", "Preparing the volumes of container %s: %v", c.Name, err)
		return fmt.Errorf("preparing the volumes of container %s: %w", c.Name, err)
	}
	if r.network != nil && !pod.Spec.HostNetwork && rec.sandboxNet == nil {
		sb, err := r.network.attach(context.Background(), pod)
		if err != nil {
			r.recorder.Eventf(pod, corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
			return fmt.Errorf("creating the sandbox of pod %s: %w", podKey(pod), err)
		}
		rec.sandboxNet = sb
	}
	rec.sandbox = sandboxReady
	podIP := r.address
	if rec.sandboxNet != nil {
		podIP = rec.sandboxNet.ip
	}
	env, err := containerEnv(pod, c, r.address, podIP)
	if err != nil {
		status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonConfigError, Message: err.Error()}}
		r.recorder.Eventf(pod, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		rec.containers[c.Name] = &containerRecord{status: status}
		return nil
	}
	mounts, skipped := containerMounts(r.layout, pod, c)
	if len(skipped) > 0 {
		r.logger.V(4).Info("Not mounting volumes of unsupported types", "pod", klog.KObj(pod), "container", c.Name, "volumes", skipped)
	}

	status.ContainerID = runtimeName + "://" + newContainerID()
	startedAt := metav1.NewTime(now).Rfc3339Copy()
	netns := ""
	if rec.sandboxNet != nil {
		netns = rec.sandboxNet.netns
	}
	proc, err := r.exec(pod, c, env, mounts, netns, status.RestartCount)
	if err != nil {
		status.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: shimFailed, Reason: reasonStartError, Message: err.Error(),
			StartedAt: startedAt, FinishedAt: startedAt, ContainerID: status.ContainerID,
		}}
		r.recorder.Eventf(pod, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		rec.containers[c.Name] = &containerRecord{status: status}
		return nil
	}
	status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startedAt}}
	rec.containers[c.Name] = &containerRecord{status: status, proc: proc}
	r.track(proc)
	go r.waitExit(rec, c.Name, proc)
	r.logger.V(2).Info("Started container", "pod", klog.KObj(pod), "container", c.Name, "pid", proc.pid())
	r.recorder.Eventf(pod, corev1.EventTypeNormal, "Started", "Started container %s", c.Name)
	return nil
}

// exec starts the process of container c: command[0] resolved through the node's binaries,
// the rest of the command and the args with $(VAR) references expanded.
func (r *podRuntime) exec(pod *corev1.Pod, c *corev1.Container, env []string, mounts []bindMount, netns string, restartCount int32) (*process, error) {
	if len(c.Command) == 0 {
		return nil, errors.New("the emulated node runs no images: the container needs a command")
	}
	lookup := envLookup(env)
	var args []string
	for _, a := range slices.Concat(c.Command, c.Args) {
		args = append(args, expand(a, lookup))
	}
	path, ok := r.binaries[args[0]]
	if !ok {
		return nil, fmt.Errorf("command %q is not among the binaries of node %s (%s)",
			args[0], r.nodeName, strings.Join(slices.Sorted(maps.Keys(r.binaries)), ", "))
	}
	user, err := containerCredentials(pod, c)
	if err != nil {
		return nil, err
	}
	records, err := userRecords(user, filepath.Join(r.layout.podDir(pod.UID), "etc", c.Name))
	if err != nil {
		return nil, fmt.Errorf("the container's user records: %w", err)
	}
	mounts = append(mounts, records...)
	devices, err := containerDevices(r.devices, c)
	if err != nil {
		return nil, err
	}
	blocks, err := claimDevices(r.layout, pod, c)
	if err != nil {
		return nil, err
	}
	devices = append(devices, blocks...)
	spec := shimSpec{Path: path, Args: args, Env: env, Dir: cmp.Or(c.WorkingDir, "/"), Mounts: mounts, User: user, Devices: devices, NetNS: netns,
		DeviceDir: filepath.Join(r.layout.podDir(pod.UID), "devices", c.Name), CPUGroup: r.cpuGroup}
	return startProcess(spec, r.layout.logPath(pod.Namespace, pod.Name, pod.UID, c.Name, restartCount))
}

func newContainerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails.
	return hex.EncodeToString(b)
}

// waitExit records the exit of a container's process and has its pod synced.
func (r *podRuntime) waitExit(rec *podRecord, name string, proc *process) {
	<-proc.done
	r.untrack(proc)
	rec.mu.Lock()
	if cr := rec.containers[name]; cr != nil && cr.proc == proc {
		reason := reasonCompleted
		if proc.exitCode != 0 {
			reason = reasonError
		}
		cr.status.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode:    proc.exitCode,
			Reason:      reason,
			StartedAt:   cr.status.State.Running.StartedAt,
			FinishedAt:  metav1.Now().Rfc3339Copy(),
			ContainerID: cr.status.ContainerID,
		}}
		cr.proc = nil
	}
	rec.mu.Unlock()
	r.logger.V(2).Info("Container exited", "pod", rec.key, "container", name, "exitCode", proc.exitCode)
	r.changed(rec.key)
}

// stop stops the containers of rec within grace seconds: SIGTERM the first time, SIGKILL
// when the grace period ends. A later, shorter grace period brings the SIGKILL forward; a
// longer one changes nothing. pod is nil for a pod gone from the API server (no events then).
func (r *podRuntime) stop(pod *corev1.Pod, rec *podRecord, grace int64, now time.Time) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	first := rec.gracePeriod == 0
	if !first && grace >= rec.gracePeriod {
		return
	}
	rec.gracePeriod = grace
	if !rec.runningLocked() {
		return
	}
	if first {
		for name, cr := range rec.containers {
			if cr.proc == nil {
				continue
			}
			cr.proc.signal(syscall.SIGTERM)
			if pod != nil {
				r.recorder.Eventf(pod, corev1.EventTypeNormal, "Killing", "Stopping container %s", name)
			}
		}
	}
	killAt := now.Add(time.Duration(grace) * time.Second)
	if rec.killTimer != nil && !killAt.Before(rec.killAt) {
		return
	}
	if rec.killTimer != nil {
		rec.killTimer.Stop()
	}
	r.logger.V(2).Info("Stopping pod", "pod", rec.key, "gracePeriod", grace)
	rec.killAt = killAt
	rec.killTimer = time.AfterFunc(killAt.Sub(now), rec.kill)
}

func (r *podRuntime) track(p *process) {
	r.liveMu.Lock()
	defer r.liveMu.Unlock()
	r.live[p] = struct{}{}
}

func (r *podRuntime) untrack(p *process) {
	r.liveMu.Lock()
	defer r.liveMu.Unlock()
	delete(r.live, p)
}

// shutdown kills every container the node runs and waits until they are gone: the node stops.
func (r *podRuntime) shutdown() {
	r.mu.Lock()
	for _, rec := range r.records {
		rec.mu.Lock()
		if rec.killTimer != nil {
			rec.killTimer.Stop()
		}
		rec.mu.Unlock()
	}
	r.mu.Unlock()

	r.liveMu.Lock()
	procs := slices.Collect(maps.Keys(r.live))
	r.liveMu.Unlock()
	for _, p := range procs {
		p.signal(syscall.SIGKILL)
	}
	for _, p := range procs {
		<-p.done
	}
	r.mu.Lock()
	recs := slices.Collect(maps.Values(r.records))
	r.mu.Unlock()
	for _, rec := range recs {
		r.releaseNetwork(rec)
	}
}
