package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/responder"
	"github.com/lifeboat-vm/lifeboat/test/evictionrequest"
)

const requester = "drain.example.com/admin"

// TestEvictionRequestLiveMigratesTheVM: an EvictionRequest for a LiveMigrate VM's pod makes
// lifeboat, the pod's declared responder, live-migrate the VM; the guest counts on, lifeboat's
// heartbeats respect the API's bounds, and it completes once the source pod has ended, so the
// evictionrequest controller can move on.
func TestEvictionRequestLiveMigratesTheVM(t *testing.T) {
	setConfig(t, false)
	startController(t)
	nodes := startNodes(t, 2)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("requested", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	before := waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)
	pod := launcherPod(t, vmi)
	if r := pod.Spec.EvictionResponders; len(r) != 1 || r[0].Name != v1alpha1.EvictionResponderName || ptr.Deref(r[0].Priority, 0) != 10000 {
		t.Fatalf("the launcher pod must declare lifeboat as its responder at priority 10000: %+v", r)
	}

	ctx := context.Background()
	erc, err := evictionrequest.Request(ctx, cluster.Kube, pod, requester)
	if err != nil {
		t.Fatal(err)
	}
	beats := recordHeartbeats(t, erc)
	moved := waitVMI(t, ns, vmi.Name, 2*time.Minute, "the VM on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	if c := moved.Status.MigrationState.Cause; c != v1alpha1.MigrationCauseEvictionRequest {
		t.Errorf("migration cause %q, want EvictionRequest", c)
	}
	target := nodeOf(t, nodes, moved)
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)

	ev, err := erc.Wait(ctx, time.Minute, "lifeboat's completionTime", func(ev *lifecyclev1alpha1.Eviction) bool { return responder.Entry(ev).CompletionTime != nil })
	if err != nil {
		t.Fatal(err)
	}
	entry := responder.Entry(ev)
	if msg := ptr.Deref(entry.Message, ""); !strings.Contains(msg, "live-migrated from node "+source.Name()+" to node "+target.Name()) {
		t.Errorf("completion message %q: want it to say where the VM went", msg)
	}
	if p, err := cluster.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || (p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed) {
		t.Errorf("lifeboat completes only once the source pod is terminal: %v %v", p.Status.Phase, err)
	}
	waitEvent(t, ns, erc.Name, responder.ReasonEvacuated, 10*time.Second)
	if next, err := erc.Advance(ctx); err != nil || next != lifecyclev1alpha1.EvictionResponderImperativeEviction {
		t.Fatalf("after lifeboat completed, the evictionrequest controller must be able to move on: next %q, %v", next, err)
	}
	checkHeartbeats(t, beats(), responder.MaxHeartbeatInterval)
}

// TestWithdrawnEvictionRequestCancelsTheMigration: while a slow pre-copy migration runs for an
// EvictionRequest, lifeboat heartbeats within its bounds (every 25 s here); when the requester
// withdraws, the Eviction is canceled, lifeboat clears its mark, the migration is cancelled and
// the guest runs on where it was.
func TestWithdrawnEvictionRequestCancelsTheMigration(t *testing.T) {
	const interval = 25 * time.Second
	source, vmi, before := unconvergingVM(t, "withdrawn", "--eviction-heartbeat-interval", interval.String())
	ns := vmi.Namespace

	ctx := context.Background()
	erc, err := evictionrequest.Request(ctx, cluster.Kube, launcherPod(t, vmi), requester)
	if err != nil {
		t.Fatal(err)
	}
	beats := recordHeartbeats(t, erc)
	m := waitRunningMigration(t, ns, "the EvictionRequest")
	// Three heartbeats show the cadence: at least 20 s apart, at most the interval.
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*interval, true, func(context.Context) (bool, error) { return len(beats()) >= 3, nil })
	if err != nil {
		t.Fatalf("want 3 heartbeats within %s, got %v", 3*interval, beats())
	}
	checkHeartbeats(t, beats(), interval)
	if ev, err := erc.Get(ctx); err != nil || !strings.Contains(ptr.Deref(responder.Entry(ev).Message, ""), "migration "+m.Name+" is Running") {
		t.Errorf("the heartbeat's message must tell the migration's progress: %+v %v", responder.Entry(ev), err)
	}

	if err := erc.Withdraw(ctx, requester); err != nil {
		t.Fatal(err)
	}
	waitCancelled(t, m, "withdrawing the EvictionRequest")
	waitEvent(t, ns, erc.Name, responder.ReasonCanceled, 10*time.Second)
	after := waitCounterPast(t, source.consolePath(vmi), before+2, 30*time.Second)
	if v := waitVMI(t, ns, vmi.Name, 5*time.Second, "Running", running); v.Status.NodeName != source.Name() || v.Status.EvacuationNodeName != "" {
		t.Errorf("a canceled Eviction leaves the VM where it was, unmarked: %s", describe(v))
	}
	waitCounterPast(t, source.consolePath(vmi), after+1, 10*time.Second)
}

// heartbeat is one heartbeat lifeboat wrote, with the expected completion it gave.
type heartbeat struct{ at, expected *metav1.Time }

// recordHeartbeats watches lifeboat's entry on the Eviction and keeps each new heartbeat.
func recordHeartbeats(t *testing.T, erc *evictionrequest.Controller) func() []heartbeat {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var beats []heartbeat
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			ev, err := erc.Get(ctx)
			if err != nil {
				return false, nil
			}
			e := responder.Entry(ev)
			if e == nil || e.HeartbeatTime == nil {
				return false, nil
			}
			mu.Lock()
			defer mu.Unlock()
			if n := len(beats); n == 0 || !beats[n-1].at.Equal(e.HeartbeatTime) {
				beats = append(beats, heartbeat{e.HeartbeatTime, e.ExpectedCompletionTime})
			}
			return false, nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() []heartbeat {
		mu.Lock()
		defer mu.Unlock()
		return append([]heartbeat(nil), beats...)
	}
}

// checkHeartbeats: heartbeats go forward, never closer than the API's 20 s, never further apart
// than max (plus a second of the API's second-resolution times and a second of processing).
func checkHeartbeats(t *testing.T, beats []heartbeat, max time.Duration) {
	t.Helper()
	if len(beats) == 0 {
		t.Fatal("lifeboat wrote no heartbeat")
	}
	for i, b := range beats {
		if b.expected != nil && b.expected.Before(b.at) {
			t.Errorf("heartbeat %d at %s expects completion in the past (%s)", i, b.at, b.expected)
		}
		if i == 0 {
			continue
		}
		gap := b.at.Sub(beats[i-1].at.Time)
		if gap < responder.MinHeartbeatInterval || gap > max+2*time.Second {
			t.Errorf("heartbeats %d and %d are %s apart: want %s to %s", i-1, i, gap, responder.MinHeartbeatInterval, max)
		}
	}
	var times []string
	for _, b := range beats {
		times = append(times, b.at.UTC().Format(time.TimeOnly))
	}
	t.Logf("%d heartbeats at %s", len(beats), strings.Join(times, ", "))
}
