package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// The target's kubelet makes its pod Ready a second after the pod's readiness gate went True (a
// kubelet follows the gate only when it next syncs the pod), and the source's kubelet follows its
// gate at once: the source pod stays a ready endpoint until the target is one, so the Service
// has a ready endpoint throughout and its proxies never refuse a connection.
func TestTheServiceKeepsAReadyEndpointWhileTheTargetsKubeletIsSlow(t *testing.T) {
	const targetKubeletLag = time.Second
	s, targetNode := servedVMWithTarget(t, "ep-slow")
	endpoints := watchServiceEndpoints(t, s.ns, "vm")
	kubelets := playKubeletsFollowingGates(t, s, targetKubeletLag)

	s.moveTo(t, targetNode)
	s.targetReady = s.waitReadyEndpoint(t, s.target)
	s.waitUnlisted(t, 10*time.Second)
	// The watch has seen the whole switch once it shows its end: the target ready, the source not.
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return endpoints.readyNow(s.target.UID) && !endpoints.readyNow(s.source.UID), nil
	})
	if err != nil {
		t.Fatalf("the EndpointSlice watch never showed the target ready and the source not: it shows %s", endpoints.now())
	}

	empty, err := endpoints.stop()
	if err != nil {
		t.Fatalf("watching the Service's EndpointSlices: %v", err)
	}
	for _, e := range empty {
		t.Errorf("the Service had no ready endpoint (its proxies refuse connections): %s", e)
	}
	seen, err := kubelets.stop()
	if err != nil {
		t.Fatalf("playing the kubelets: %v", err)
	}
	switch {
	case seen.targetReady == 0 || seen.sourceGateFalse == 0:
		t.Fatalf("the pod watch did not see both the target Ready (event %d) and the source's gate False (event %d)", seen.targetReady, seen.sourceGateFalse)
	case seen.sourceGateFalse < seen.targetReady:
		t.Errorf("the source pod's readiness gate went False (pod event %d, %s after the target's went True) before the target pod was Ready (event %d, %s after)",
			seen.sourceGateFalse, seen.sourceGateFalseAt.Sub(seen.targetGateTrueAt).Round(time.Millisecond),
			seen.targetReady, seen.targetReadyAt.Sub(seen.targetGateTrueAt).Round(time.Millisecond))
	default:
		t.Logf("the target's gate went True, its kubelet made it Ready %s later, and the source's gate went False %s after that",
			seen.targetReadyAt.Sub(seen.targetGateTrueAt).Round(time.Millisecond), seen.sourceGateFalseAt.Sub(seen.targetReadyAt).Round(time.Millisecond))
	}
}

// The target's kubelet never makes its pod Ready: the source pod leaves the Service
// KubeletFollowsGateWithin after the target's gate went True, not never.
func TestASourcePodLeavesTheServiceWhenTheTargetsKubeletNeverFollows(t *testing.T) {
	s, targetNode := servedVMWithTarget(t, "ep-never")
	kubelets := playKubeletsFollowingGates(t, s, -1)
	s.moveTo(t, targetNode)
	waitGate(t, s.target, corev1.ConditionTrue)
	start := time.Now()
	source := kubewait.For(t, vmi.KubeletFollowsGateWithin+10*time.Second, fmt.Sprintf("pod %s's readiness gate False", s.source.Name), func(ctx context.Context) (*corev1.Pod, error) {
		return cluster.Kube.CoreV1().Pods(s.ns).Get(ctx, s.source.Name, metav1.GetOptions{})
	}, func(p *corev1.Pod) bool {
		return podCondition(p, v1alpha1.PodConditionGuestRunning) == corev1.ConditionFalse
	},
		func(p *corev1.Pod) string { return fmt.Sprintf("%+v", p.Status.Conditions) })
	t.Logf("the source's gate was seen False %s after the target's was seen True", time.Since(start).Round(time.Millisecond))
	target, err := cluster.Kube.CoreV1().Pods(s.ns).Get(context.Background(), s.target.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if podCondition(target, corev1.PodReady) == corev1.ConditionTrue {
		t.Fatalf("the target pod is Ready although its kubelet never made it so: %+v", target.Status.Conditions)
	}
	// The conditions' times are whole seconds, which keeps a difference of at least the bound one.
	sourceAt, targetAt := gateSince(source), gateSince(target)
	if d := sourceAt.Sub(targetAt); d < vmi.KubeletFollowsGateWithin {
		t.Errorf("the source's gate went False at %s, %s after the target's went True (%s): sooner than %s, although the target was not Ready",
			sourceAt.Format(time.RFC3339), d, targetAt.Format(time.RFC3339), vmi.KubeletFollowsGateWithin)
	}
	if _, err := kubelets.stop(); err != nil {
		t.Fatalf("playing the kubelets: %v", err)
	}
}

func gateSince(pod *corev1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1alpha1.PodConditionGuestRunning {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// endpointWatch follows a Service's EndpointSlices from a watch and keeps the description of
// each state in which they listed no ready endpoint.
type endpointWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	slices map[string]discoveryv1.EndpointSlice
	empty  []string
	err    error
}

func watchServiceEndpoints(t *testing.T, ns, service string) *endpointWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &endpointWatch{cancel: cancel, done: make(chan struct{}), slices: map[string]discoveryv1.EndpointSlice{}}
	t.Cleanup(func() { _, _ = w.stop() })
	selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}).String()
	list, err := cluster.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		close(w.done)
		t.Fatal(err)
	}
	for _, sl := range list.Items {
		w.slices[sl.Name] = sl
	}
	w.check("as listed")
	events, err := cluster.Kube.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion})
	if err != nil {
		close(w.done)
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		defer events.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-events.ResultChan():
				// A watch stopped by cancel may first deliver an ERROR event saying so.
				if ctx.Err() != nil {
					return
				}
				if !ok {
					w.fail(errors.New("the watch ended"))
					return
				}
				if err := w.apply(ev); err != nil {
					w.fail(err)
					return
				}
			}
		}
	}()
	return w
}

func (w *endpointWatch) apply(ev watch.Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	sl, ok := ev.Object.(*discoveryv1.EndpointSlice)
	if !ok {
		return fmt.Errorf("a watch event %s of %T: %+v", ev.Type, ev.Object, ev.Object)
	}
	switch ev.Type {
	case watch.Added, watch.Modified:
		w.slices[sl.Name] = *sl
	case watch.Deleted:
		delete(w.slices, sl.Name)
	default:
		return nil
	}
	w.checkLocked(fmt.Sprintf("after %s %s", ev.Type, sl.Name))
	return nil
}

func (w *endpointWatch) check(when string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checkLocked(when)
}

// checkLocked keeps the current state if it lists no ready endpoint (unknown reads as ready, as
// the API says).
func (w *endpointWatch) checkLocked(when string) {
	for _, sl := range w.slices {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				return
			}
		}
	}
	w.empty = append(w.empty, fmt.Sprintf("%s at %s: %s", when, time.Now().Format("15:04:05.000"), w.describeLocked()))
}

func (w *endpointWatch) describeLocked() string {
	var all []discoveryv1.EndpointSlice
	for _, sl := range w.slices {
		all = append(all, sl)
	}
	return describeSlices(all)
}

func (w *endpointWatch) now() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.describeLocked()
}

// readyNow says whether the slices as last seen list pod as a ready endpoint.
func (w *endpointWatch) readyNow(pod types.UID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, sl := range w.slices {
		for _, ep := range sl.Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.UID == pod && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				return true
			}
		}
	}
	return false
}

func (w *endpointWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// stop ends the watch and says which states had no ready endpoint, and why the watch failed if
// it did.
func (w *endpointWatch) stop() ([]string, error) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.empty, w.err
}

// gateKubelets plays the kubelets of a migration's two pods from a watch of the namespace's pods:
// the target's makes its pod Ready lag after its readiness gate went True (never if lag is
// negative), the source's makes
// its pod unready as soon as its gate went False. It notes the order (the watch's, which is the
// API server's) in which it saw those.
type gateKubelets struct {
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu   sync.Mutex
	seen gateOrder
	err  error
}

// gateOrder is the number of the pod watch's event in which each was first seen (0: not seen),
// and when.
type gateOrder struct {
	targetGateTrue, targetReady, sourceGateFalse       int
	targetGateTrueAt, targetReadyAt, sourceGateFalseAt time.Time
}

func playKubeletsFollowingGates(t *testing.T, s *servedVM, lag time.Duration) *gateKubelets {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k := &gateKubelets{cancel: cancel}
	t.Cleanup(func() { _, _ = k.stop() })
	list, err := cluster.Kube.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	events, err := cluster.Kube.CoreV1().Pods(s.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	k.done.Add(1)
	go func() {
		defer k.done.Done()
		defer events.Stop()
		n := 0
		for {
			var ev watch.Event
			var ok bool
			select {
			case <-ctx.Done():
				return
			case ev, ok = <-events.ResultChan():
			}
			// A watch stopped by stop may first deliver an ERROR event saying so.
			if ctx.Err() != nil {
				return
			}
			if !ok {
				k.fail(errors.New("the pod watch ended"))
				return
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				k.fail(fmt.Errorf("a pod watch event %s of %T: %+v", ev.Type, ev.Object, ev.Object))
				return
			}
			n++
			gate, ready := podCondition(pod, v1alpha1.PodConditionGuestRunning), podCondition(pod, corev1.PodReady)
			k.mu.Lock()
			seen := &k.seen
			switch pod.UID {
			case s.target.UID:
				if seen.targetGateTrue == 0 && gate == corev1.ConditionTrue {
					seen.targetGateTrue, seen.targetGateTrueAt = n, time.Now()
				}
				if seen.targetGateTrue == n && lag >= 0 {
					k.done.Add(1)
					go func() {
						defer k.done.Done()
						select {
						case <-ctx.Done():
						case <-time.After(lag):
							if err := writeKubeletStatus(ctx, s.target, "10.250.0.2", true); err != nil && ctx.Err() == nil {
								k.fail(err)
							}
						}
					}()
				}
				if seen.targetReady == 0 && ready == corev1.ConditionTrue {
					seen.targetReady, seen.targetReadyAt = n, time.Now()
				}
			case s.source.UID:
				if seen.sourceGateFalse == 0 && gate == corev1.ConditionFalse {
					seen.sourceGateFalse, seen.sourceGateFalseAt = n, time.Now()
				}
			}
			k.mu.Unlock()
			if pod.UID == s.source.UID && gate == corev1.ConditionFalse && ready == corev1.ConditionTrue {
				// A write that stop cut short is no failure.
				if err := writeKubeletStatus(ctx, s.source, "10.250.0.1", false); err != nil && ctx.Err() == nil {
					k.fail(err)
					return
				}
			}
		}
	}()
	return k
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range pod.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

func (k *gateKubelets) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil {
		k.err = err
	}
}

// stop ends the kubelets and says what they saw.
func (k *gateKubelets) stop() (gateOrder, error) {
	k.cancel()
	k.done.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.seen, k.err
}
