package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sync"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// controlSocket is where serve takes requests that only the emulated nodes can carry out.
const controlSocket = "control.sock"

// serveControl answers POST /evict?namespace=NS&pod=NAME by evicting the pod the way its node's
// kubelet does under memory pressure; the eviction runs on after the answer.
func serveControl(ctx context.Context, dir string, nodes []*node.Node) (stop func(), err error) {
	path := filepath.Join(dir, controlSocket)
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /evict", func(w http.ResponseWriter, r *http.Request) {
		ns, name, nodeName := r.URL.Query().Get("namespace"), r.URL.Query().Get("pod"), r.URL.Query().Get("node")
		for _, n := range nodes {
			if n.Name() != nodeName {
				continue
			}
			go func() {
				if err := n.EvictPod(ctx, ns, name); err != nil {
					fmt.Fprintf(os.Stderr, "evicting %s/%s: %v\n", ns, name, err)
				}
			}()
			w.WriteHeader(http.StatusAccepted)
			_ = json.NewEncoder(w).Encode(map[string]string{"node": nodeName, "pod": ns + "/" + name})
			return
		}
		http.Error(w, fmt.Sprintf("no emulated node named %q", nodeName), http.StatusNotFound)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return func() { _ = srv.Close() }, nil
}

func clients(dir string) (kubernetes.Interface, lifeboatclient.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	lb, err := lifeboatclient.NewForConfig(cfg)
	return kube, lb, err
}

func splitRef(ref string) (ns, name string) {
	if ns, name, ok := strings.Cut(ref, "/"); ok {
		return ns, name
	}
	return "default", ref
}

// evict has the node of a VMI evict its launcher pod for memory pressure, as a kubelet would.
func evict(ctx context.Context, dir, ref string) error {
	ns, name := splitRef(ref)
	kube, lb, err := clients(dir)
	if err != nil {
		return err
	}
	vmi, err := lb.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: v1alpha1.LabelVMIUID + "=" + string(vmi.UID), FieldSelector: "spec.nodeName=" + vmi.Status.NodeName + ",status.phase=Running"})
	if err != nil {
		return err
	}
	if len(pods.Items) != 1 {
		return fmt.Errorf("VMI %s has %d running launcher pods on node %q, want 1", ref, len(pods.Items), vmi.Status.NodeName)
	}
	pod := pods.Items[0]
	client := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, controlSocket))
	}}}
	q := url.Values{"namespace": {ns}, "pod": {pod.Name}, "node": {pod.Spec.NodeName}}
	resp, err := client.Post("http://lifeboat-cluster/evict?"+q.Encode(), "", nil)
	if err != nil {
		return fmt.Errorf("asking the demo cluster to evict %s (is it up?): %w", pod.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("evicting %s: %s", pod.Name, strings.TrimSpace(string(b)))
	}
	fmt.Printf("node %s evicts pod %s/%s for memory pressure, as its kubelet would (SIGTERM, grace period min(pod's, evictionMaxPodGracePeriod))\n", pod.Spec.NodeName, ns, pod.Name)
	return nil
}

// follow prints the migrations of a VMI as they progress, until the VMI runs on another node;
// then that the guest's counter went on, how long it stood still and how the source launcher
// ended, as the nodes' files show. nodesOnly prints the latter alone.
func follow(ctx context.Context, dir, ref string, timeout time.Duration, nodesOnly bool) error {
	ns, name := splitRef(ref)
	kube, lb, err := clients(dir)
	if err != nil {
		return err
	}
	vmis := lb.LifeboatV1alpha1().VirtualMachineInstances(ns)
	start, err := vmis.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	from, to := start.Status.NodeName, ""
	// The VMI's pods as a watch sees them from now on: lifeboat deletes a source pod its kubelet
	// keeps Ready (as a real kubelet does while it ends it), which may be gone a moment after it
	// ended.
	pods, err := watchPods(ctx, kube, ns, string(start.UID))
	if err != nil {
		return err
	}
	root, err := readNodesRoot(dir)
	if err != nil {
		return err
	}
	// The guest's counter on every node's console for this VMI: how long it stood still.
	stood := guest.WatchCounters(ctx, guestTick, func() []string {
		paths, _ := filepath.Glob(consolePath(root, "*", string(start.UID)))
		return paths
	})
	var deadline *metav1.Time // the kubelet's SIGKILL, as the migrations record it
	say := func(format string, args ...any) {
		if !nodesOnly {
			fmt.Printf(format, args...)
		}
	}
	say("following VMI %s/%s, running on %s\n", ns, name, from)
	migrations := lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	selector := metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(start.UID)}
	earlier := map[string]bool{} // migrations that ended before this one: not followed
	if list, err := migrations.List(ctx, selector); err == nil {
		for _, m := range list.Items {
			earlier[m.Name] = m.Status.Phase.Terminal()
		}
	}
	last := ""
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := migrations.List(ctx, selector)
		if err != nil {
			return false, nil
		}
		for i := range list.Items {
			if list.Items[i].Status.Phase == "" || earlier[list.Items[i].Name] {
				continue // not yet seen by the migration controller, or over before we came
			}
			if list.Items[i].Status.Deadline != nil {
				deadline = list.Items[i].Status.Deadline
			}
			if line := vm.MigrationLine(&list.Items[i], time.Now()); line != last {
				say("%s  %s\n", time.Now().Format("15:04:05.0"), line)
				last = line
			}
		}
		v, err := vmis.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		s := v.Status.MigrationState
		if v.Status.NodeName == from || s == nil || !s.Completed {
			return false, nil
		}
		took := ""
		if s.StartTimestamp != nil && s.EndTimestamp != nil {
			took = fmt.Sprintf(" in %s", s.EndTimestamp.Sub(s.StartTimestamp.Time))
		}
		say("VMI %s/%s now runs on %s: moved from %s%s (mode %s, cause %s)\n", ns, name, v.Status.NodeName, s.SourceNode, took, s.Mode, s.Cause)
		to = v.Status.NodeName
		return true, nil
	})
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("VMI %s/%s did not move within %s", ns, name, timeout)
	}
	if err != nil {
		return err
	}
	if err := counterGoesOn(ctx, root, string(start.UID), from, to, stood); err != nil {
		return err
	}
	return sourceLauncherEnded(ctx, pods, from, deadline)
}

// podWatch holds the last state a watch saw of each pod.
type podWatch struct {
	mu   sync.Mutex
	last map[string]*corev1.Pod
}

// watchPods watches the pods of the VMI with uid until ctx ends.
func watchPods(ctx context.Context, kube kubernetes.Interface, ns, uid string) (*podWatch, error) {
	w, err := kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + uid})
	if err != nil {
		return nil, err
	}
	pw := &podWatch{last: map[string]*corev1.Pod{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				pw.mu.Lock()
				pw.last[p.Name] = p
				pw.mu.Unlock()
			}
		}
	}()
	return pw, nil
}

// ended is the pod on node that the watch saw end (Succeeded or Failed), if one did.
func (pw *podWatch) ended(node string) *corev1.Pod {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	for _, p := range pw.last {
		if p.Spec.NodeName == node && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
			return p
		}
	}
	return nil
}

// sourceLauncherEnded waits for the source launcher pod to end and says how: exit code 0, by
// itself, before the kubelet's grace period ran out.
func sourceLauncherEnded(ctx context.Context, pods *podWatch, node string, deadline *metav1.Time) error {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		pod = pods.ended(node)
		return pod != nil, nil
	})
	if err != nil {
		return fmt.Errorf("the source launcher pod on %s did not end within 30s", node)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			within := ""
			if deadline != nil {
				within = fmt.Sprintf(", %s before its grace period ended", deadline.Sub(t.FinishedAt.Time).Truncate(time.Second))
			}
			recorded := string(pod.Status.Phase)
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
					recorded += fmt.Sprintf(", %s %s: %q", c.Type, c.Reason, c.Message)
				}
			}
			fmt.Printf("the source launcher in pod %s exited %d at %s%s; the kubelet recorded the pod as %s\n",
				pod.Name, t.ExitCode, t.FinishedAt.Format("15:04:05"), within, recorded)
		}
	}
	return nil
}

// guestTick is how often the demo's guest prints its counter (the test guest's default).
const guestTick = time.Second

// counterGoesOn shows that the guest did not reboot: the counter it printed on the source node
// goes on, from where it was, on the target; and says how long the counter stood still (stood
// is guest.WatchCounters' stop), which is how long the guest was stopped, as its console shows.
func counterGoesOn(ctx context.Context, root, uid, from, to string, stood func() guest.Stall) error {
	b, err := os.ReadFile(consolePath(root, from, uid))
	if err != nil {
		return err
	}
	before := guest.Counter(string(b))
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Two counters on: the watch has seen the first for certain.
	console, err := guest.WaitForConsole(ctx, consolePath(root, to, uid), fmt.Sprintf("a counter above %d", before+1), func(c string) bool {
		return guest.Counter(c) > before+1
	})
	if err != nil {
		return err
	}
	fmt.Printf("the guest's counter was at %d on %s when it left; on %s it goes on at %d, without a reboot\n", before, from, to, guest.Counter(console))
	fmt.Printf("the guest stood still for %s at most: its counter's longest silence beyond its %s tick, read from its consoles every 5 ms\n",
		stood().Longest.Round(time.Millisecond), guestTick)
	return nil
}
