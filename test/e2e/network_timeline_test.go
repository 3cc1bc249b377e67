package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"io"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// switchWatch records, as the test sees them, when the objects that route a Service to a VM
// change during its migration: the pods' readiness gates, Ready conditions, phases and deletions,
// and the EndpointSlices' ready endpoints. Times are when the watch delivered the change.
type switchWatch struct {
	mu sync.Mutex
	// first is, per event name, when it was seen first.
	first map[string]time.Time
	// last is each pod as last seen, deleted or not.
	last map[string]*corev1.Pod
	stop context.CancelFunc
	done sync.WaitGroup
}

// watchSwitch starts watching ns's pods and EndpointSlices.
func watchSwitch(tb testing.TB, ns string) *switchWatch {
	tb.Helper()
	ctx, stop := context.WithCancel(context.Background())
	w := &switchWatch{first: map[string]time.Time{}, last: map[string]*corev1.Pod{}, stop: stop}
	pods, err := cluster.Kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	slicesWatch, err := cluster.Kube.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	w.done.Go(func() { w.follow(ctx, pods) })
	w.done.Go(func() { w.follow(ctx, slicesWatch) })
	return w
}

func (w *switchWatch) follow(ctx context.Context, events watch.Interface) {
	defer events.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events.ResultChan():
			if !ok {
				return
			}
			now := time.Now()
			var seen []string
			switch o := e.Object.(type) {
			case *corev1.Pod:
				seen = append(seen, podPhase(o.Name, o.Status.Phase))
				if e.Type == watch.Deleted {
					seen = append(seen, podDeleted(o.Name))
				}
				w.mu.Lock()
				w.last[o.Name] = o
				w.mu.Unlock()
				for _, c := range o.Status.Conditions {
					if c.Type == v1alpha1.PodConditionGuestRunning || c.Type == corev1.PodReady {
						seen = append(seen, fmt.Sprintf("pod %s %s=%s", o.Name, c.Type, c.Status))
					}
				}
			case *discoveryv1.EndpointSlice:
				var ready []string
				for _, ep := range o.Endpoints {
					if ep.TargetRef != nil && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						ready = append(ready, ep.TargetRef.Name)
					}
				}
				slices.Sort(ready)
				seen = append(seen, sliceReady(ready...))
			}
			w.mu.Lock()
			for _, s := range seen {
				if _, ok := w.first[s]; !ok {
					w.first[s] = now
				}
			}
			w.mu.Unlock()
		}
	}
}

// at is when event was first seen, zero if never.
func (w *switchWatch) at(event string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first[event]
}

// firstOf is when the first of the events match accepts was seen, zero if none was.
func (w *switchWatch) firstOf(match func(event string) bool) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for e, at := range w.first {
		if match(e) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}

// lastPod is the pod named name as last seen; nil if never seen.
func (w *switchWatch) lastPod(name string) *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[name]
}

// podPhase is the event of pod's being seen in phase.
func podPhase(pod string, phase corev1.PodPhase) string {
	return "pod " + pod + " phase=" + string(phase)
}

// podDeleted is the event of pod's deletion from the API.
func podDeleted(pod string) string { return "pod " + pod + " deleted" }

func (w *switchWatch) close() {
	w.stop()
	w.done.Wait()
}

// logTimes reads the times of the JSON log lines of path whose msg is msg and whose vmi field,
// when the line has one, names vmi.
func logTimes(tb testing.TB, path, msg, vmi string) []time.Time {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	return logTimesIn(f, msg, vmi)
}

// logTimesIn is logTimes of a log read from r.
func logTimesIn(r io.Reader, msg, vmi string) []time.Time {
	var out []time.Time
	eachLogLine(r, func(line jsonLogLine) {
		if line.Msg == msg && (line.VMI == "" || line.VMI == vmi || strings.HasSuffix(line.VMI, "/"+vmi)) {
			out = append(out, line.Time)
		}
	})
	return out
}

// jsonLogLine is what tests read of a JSON log line of lifeboat's processes.
type jsonLogLine struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	VMI       string    `json:"vmi"`
	VMIUID    string    `json:"vmiUID"`
	PodUID    string    `json:"podUID"`
	FromAgent bool      `json:"fromAgent"`
	Err       any       `json:"err"`
}

// eachLogLine calls fn with each JSON line read from r, in order; other lines are skipped.
func eachLogLine(r io.Reader, fn func(jsonLogLine)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line jsonLogLine
		if json.Unmarshal(sc.Bytes(), &line) == nil {
			fn(line)
		}
	}
}

// kubeProxySyncs reads when kube-proxy finished writing its rules, from its klog lines
// (`I1128 05:20:01.123456 ... "SyncProxyRules complete"`), which carry neither year nor zone:
// they are this machine's local time in the current year.
func kubeProxySyncs(tb testing.TB, path string) []time.Time {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []time.Time
	year := time.Now().Year()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"SyncProxyRules complete"`) || len(line) < 21 {
			continue
		}
		t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			continue
		}
		out = append(out, t.AddDate(year, 0, 0))
	}
	return out
}

// nextAfter is the first of times after t, zero if none.
func nextAfter(times []time.Time, t time.Time) time.Time {
	for _, x := range times {
		if x.After(t) {
			return x
		}
	}
	return time.Time{}
}

// timelineEvent is one moment of a migration's network switch.
type timelineEvent struct {
	name string
	at   time.Time
}

// formatTimeline lists events in time order, in milliseconds from zero, naming the ones that
// never happened.
func formatTimeline(zero time.Time, events []timelineEvent) string {
	var seen, missing []timelineEvent
	for _, e := range events {
		if e.at.IsZero() {
			missing = append(missing, e)
		} else {
			seen = append(seen, e)
		}
	}
	slices.SortStableFunc(seen, func(a, b timelineEvent) int { return a.at.Compare(b.at) })
	var sb strings.Builder
	for _, e := range seen {
		fmt.Fprintf(&sb, "  %+6d ms  %s\n", e.at.Sub(zero).Milliseconds(), e.name)
	}
	for _, e := range missing {
		fmt.Fprintf(&sb, "  never     %s\n", e.name)
	}
	return sb.String()
}

// sliceReady names the event of an EndpointSlice whose ready endpoints are exactly pods.
func sliceReady(pods ...string) string {
	slices.Sort(pods)
	return "slice ready " + strings.Join(pods, ",")
}

// switchTimeline is the moments of a served VM's switch from sourcePod to targetPod, from the
// source's last answer (lastBefore) to the target's first (firstAfter).
func switchTimeline(tb testing.TB, w *switchWatch, lastBefore, firstAfter *answer, source, target *testNode, sourcePod, targetPod *corev1.Pod, kubeProxyLog, vmi string) string {
	tb.Helper()
	last := func(times []time.Time) time.Time {
		if len(times) == 0 {
			return time.Time{}
		}
		return times[len(times)-1]
	}
	targetStats := guestArrived(tb, target, targetPod)
	targetInSlice := w.at(sliceReady(targetPod.Name))
	if both := w.at(sliceReady(sourcePod.Name, targetPod.Name)); !both.IsZero() && (targetInSlice.IsZero() || both.Before(targetInSlice)) {
		targetInSlice = both
	}
	events := []timelineEvent{
		{"the source's last answer received", lastBefore.received},
		{"the source agent: libvirt's migration call returned", last(logTimes(tb, source.agent.LogPath(), "libvirt migration ended", vmi))},
		{"the target launcher: migration statistics (guest resumed)", targetStats},
		{"the source agent: the source pod forwards to the target pod", last(logTimes(tb, source.agent.LogPath(), podnetwork.MsgForwarding, vmi))},
		{"the source agent: the forward removed", last(logTimes(tb, source.agent.LogPath(), podnetwork.MsgForwardEnded, vmi))},
		{"target pod: readiness gate True", w.at(fmt.Sprintf("pod %s %s=True", targetPod.Name, v1alpha1.PodConditionGuestRunning))},
		{"target pod: Ready", w.at(fmt.Sprintf("pod %s %s=True", targetPod.Name, corev1.PodReady))},
		{"source pod: readiness gate False", w.at(fmt.Sprintf("pod %s %s=False", sourcePod.Name, v1alpha1.PodConditionGuestRunning))},
		{"EndpointSlice: the target ready", targetInSlice},
		{"EndpointSlice: only the target ready", w.at(sliceReady(targetPod.Name))},
		{"EndpointSlice: no endpoint ready (the proxies refuse connections)", w.at(sliceReady())},
		{"kube-proxy: rules synced after the target became an endpoint", nextAfter(kubeProxySyncs(tb, kubeProxyLog), targetInSlice)},
		{"the target's first answer: request sent", firstAfter.sent},
		{"the target's first answer received", firstAfter.received},
	}
	return formatTimeline(lastBefore.received, events)
}

// appendFile appends text to the file at path.
func appendFile(tb testing.TB, path, text string) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		tb.Fatal(err)
	}
}

// failedRequests lists the requests whose first attempt failed, in milliseconds from zero.
func failedRequests(zero time.Time, answers []answer) string {
	var sb strings.Builder
	ms := func(t time.Time) int64 { return t.Sub(zero).Milliseconds() }
	for _, a := range answers {
		if a.firstErr == nil {
			continue
		}
		retry := "answered"
		if a.err != nil {
			retry = a.err.Error()
		}
		fmt.Fprintf(&sb, "  request sent %+d ms: %v at %+d ms; retry: %s at %+d ms\n", ms(a.sent), a.firstErr, ms(a.firstDone), retry, ms(a.received))
	}
	return sb.String()
}

// guestArrived is when the target launcher logged the migration's statistics, just after the
// guest began to run there.
func guestArrived(tb testing.TB, target *testNode, targetPod *corev1.Pod) time.Time {
	tb.Helper()
	log, err := target.ContainerLog(targetPod, launcher.ContainerName)
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "migration statistics" {
			return rec.Time
		}
	}
	tb.Fatalf("the target launcher logged no migration statistics:\n%s", tail(log, 10))
	return time.Time{}
}
