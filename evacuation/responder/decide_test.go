package responder

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

var (
	t0       = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	settings = Settings{Min: MinHeartbeatInterval, Max: time.Minute}
)

func at(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(t0.Add(d))) }

// eviction is an Eviction the evictionrequest controller has processed, lifeboat in state.
func eviction(state lifecyclev1alpha1.ResponderStateType, entry lifecyclev1alpha1.ResponderStatus) *lifecyclev1alpha1.Eviction {
	entry.Name = v1alpha1.EvictionResponderName
	return &lifecyclev1alpha1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: "ev", Namespace: "ns"},
		Status: lifecyclev1alpha1.EvictionStatus{
			ObservedGeneration: ptr.To[int64](1),
			Requesters:         []lifecyclev1alpha1.Requester{{Name: "drain.example.com/a", Intent: lifecyclev1alpha1.RequesterIntentEviction}},
			TargetResponders: []lifecyclev1alpha1.TargetResponder{
				{Name: v1alpha1.EvictionResponderName, Priority: ptr.To[int32](10000), State: state},
				{Name: lifecyclev1alpha1.EvictionResponderImperativeEviction, Priority: ptr.To[int32](100), State: lifecyclev1alpha1.ResponderStateInactive},
			},
			Responders: []lifecyclev1alpha1.ResponderStatus{entry, {Name: lifecyclev1alpha1.EvictionResponderImperativeEviction}},
		},
	}
}

func started() lifecyclev1alpha1.ResponderStatus {
	return lifecyclev1alpha1.ResponderStatus{StartTime: at(-time.Second)}
}

func vm(mutate ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns", UID: "u1"},
		Spec:       v1alpha1.VirtualMachineInstanceSpec{Memory: resource.MustParse("1Gi"), EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate)},
		Status: v1alpha1.VirtualMachineInstanceStatus{
			Phase: v1alpha1.VMIRunning, NodeName: "a",
			Conditions: []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"}},
		},
	}
	for _, m := range mutate {
		m(v)
	}
	return v
}

func withStrategy(s v1alpha1.EvictionStrategy) func(*v1alpha1.VirtualMachineInstance) {
	return func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = ptr.To(s) }
}

func notMigratable(v *v1alpha1.VirtualMachineInstance) {
	v.Status.Conditions = []metav1.Condition{{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse, Reason: "LocalDisk"}}
}

func markedBy(reason string) func(*v1alpha1.VirtualMachineInstance) {
	return func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.EvacuationNodeName = v.Status.NodeName
		v.Status.Conditions = append(v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionEvictionRequested, Status: metav1.ConditionTrue, Reason: reason})
	}
}

func migratedTo(node string) func(*v1alpha1.VirtualMachineInstance) {
	return func(v *v1alpha1.VirtualMachineInstance) {
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: v.Status.NodeName, TargetNode: node, Completed: true}
		v.Status.NodeName = node
	}
}

func launcherPod(phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "launcher-vm", Namespace: "ns", UID: "p1"}, Spec: corev1.PodSpec{NodeName: "a"}, Status: corev1.PodStatus{Phase: phase}}
}

func migration(phase v1alpha1.VirtualMachineInstanceMigrationPhase, mode v1alpha1.MigrationMode) *v1alpha1.VirtualMachineInstanceMigration {
	return &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-evacuation-x", Namespace: "ns", CreationTimestamp: metav1.NewTime(t0)},
		Status:     v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase, Mode: mode, SourceNode: "a", TargetNode: "b"},
	}
}

// unschedulable is a migration that failed at end because no node took its target pod.
func unschedulable(end *metav1.Time) *v1alpha1.VirtualMachineInstanceMigration {
	m := migration(v1alpha1.MigrationFailed, "")
	m.Status.EndTimestamp, m.Status.TargetUnschedulable = end, true
	m.Status.FailureReason = "waited 5m0s for the target: 0/2 nodes are available"
	return m
}

// TestDecide mirrors the responder's duties in the 1.37 API: act only on a processed Eviction,
// only while Active; migrate, decline, leave to an external controller, cancel, stop.
func TestDecide(t *testing.T) {
	heartbeatAt := func(d time.Duration, msg string) lifecyclev1alpha1.ResponderStatus {
		e := started()
		e.HeartbeatTime, e.Message = at(d), ptr.To(msg)
		return e
	}
	running := migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModePreCopy)
	progress := "live-migrating VM ns/vm off node a: migration vm-evacuation-x is Running to node b (PreCopy); requested by drain.example.com/a"
	type want struct {
		mark, clear, write, complete bool
		outcome, reason, message     string
		heartbeat                    *metav1.Time
		requeue                      time.Duration
	}
	cases := []struct {
		name string
		obs  Observation
		want want
	}{
		{"not yet processed (no observedGeneration): nothing", Observation{
			Eviction: func() *lifecyclev1alpha1.Eviction {
				e := eviction(lifecyclev1alpha1.ResponderStateActive, started())
				e.Status.ObservedGeneration = nil
				return e
			}(), Pod: launcherPod(corev1.PodRunning), VMI: vm()}, want{}},
		{"target is not a launcher pod: nothing", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), VMI: vm()}, want{}},
		{"Inactive: not our turn", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateInactive, lifecyclev1alpha1.ResponderStatus{}), Pod: launcherPod(corev1.PodRunning), VMI: vm()}, want{}},
		{"Active without startTime: the API would reject any write", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, lifecyclev1alpha1.ResponderStatus{}), Pod: launcherPod(corev1.PodRunning), VMI: vm()}, want{}},
		{"Active, LiveMigrate: mark and first heartbeat", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm()},
			want{mark: true, write: true, reason: ReasonEvacuating, heartbeat: at(0), message: "waiting for its migration to be created", requeue: time.Minute}},
		{"Active, LiveMigrateIfPossible and migratable: mark", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(withStrategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible))},
			want{mark: true, write: true, reason: ReasonEvacuating, heartbeat: at(0), requeue: time.Minute}},
		{"Active, already marked by the kubelet: heartbeat, no second mark", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("NodePressure")), Migration: running},
			want{write: true, heartbeat: at(0), message: progress, requeue: time.Minute}},
		{"progress changed 10 s after the last heartbeat: wait for the 20 s floor", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-10*time.Second, "old")), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{requeue: 10 * time.Second}},
		{"progress changed 25 s after the last heartbeat: heartbeat", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-25*time.Second, "old")), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{write: true, heartbeat: at(0), message: progress, requeue: time.Minute}},
		{"nothing changed 30 s after the last heartbeat: wait for the interval", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-30*time.Second, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{requeue: 30 * time.Second}},
		{"nothing changed for the whole interval: heartbeat", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{write: true, heartbeat: at(0), message: progress, requeue: time.Minute}},
		{"the last heartbeat is ahead of our clock: wait until 20 s past it, never go back", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(time.Minute+5*time.Second, "old")), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{requeue: 85 * time.Second}},
		{"migrated, source pod still ending: heartbeat says so", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-time.Minute, "old")), Pod: launcherPod(corev1.PodRunning), VMI: vm(migratedTo("b"))},
			want{write: true, heartbeat: at(0), message: "now runs on node b; waiting for its old pod launcher-vm to end", requeue: time.Minute}},
		{"migrated and the source pod terminal: complete", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-5*time.Second, "old")), Pod: launcherPod(corev1.PodSucceeded), VMI: vm(migratedTo("b"))},
			want{write: true, complete: true, outcome: OutcomeMigrated, reason: ReasonEvacuated, heartbeat: at(-5 * time.Second), message: "from node a to node b"}},
		{"completed already: wait for the controller to move on", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, func() lifecyclev1alpha1.ResponderStatus {
			e := heartbeatAt(-5*time.Second, "done")
			e.CompletionTime = at(-5 * time.Second)
			return e
		}()), Pod: launcherPod(corev1.PodSucceeded), VMI: vm(migratedTo("b"))}, want{}},
		{"None: decline at once", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(withStrategy(v1alpha1.EvictionStrategyNone))},
			want{write: true, complete: true, outcome: OutcomeDeclined, reason: ReasonDeclined, heartbeat: at(0), message: "eviction strategy None"}},
		{"no strategy anywhere means None: decline", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = nil })},
			want{write: true, complete: true, outcome: OutcomeDeclined, reason: ReasonDeclined, heartbeat: at(0), message: "eviction strategy None"}},
		{"the cluster's LiveMigrate applies to a VMI without its own", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = nil }),
			Config: &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate)}}},
			want{mark: true, write: true, reason: ReasonEvacuating, heartbeat: at(0), requeue: time.Minute}},
		{"LiveMigrateIfPossible, not migratable: decline", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(withStrategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible), notMigratable)},
			want{write: true, complete: true, outcome: OutcomeDeclined, reason: ReasonDeclined, heartbeat: at(0), message: "cannot be live-migrated (LocalDisk)"}},
		{"LiveMigrate, not migratable: decline", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(notMigratable)},
			want{write: true, complete: true, outcome: OutcomeDeclined, reason: ReasonDeclined, heartbeat: at(0), message: "cannot be live-migrated (LocalDisk)"}},
		{"External: mark, then complete saying so", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(withStrategy(v1alpha1.EvictionStrategyExternal))},
			want{mark: true, write: true, complete: true, outcome: OutcomeExternal, reason: ReasonLeftToExternal, heartbeat: at(0), message: "left to the external controller"}},
		{"the target is a migration's target pod, not the VM's: decline", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(func(v *v1alpha1.VirtualMachineInstance) { v.Status.NodeName = "c" })},
			want{write: true, complete: true, outcome: OutcomeDeclined, reason: ReasonDeclined, heartbeat: at(0), message: "does not run VM ns/vm"}},
		{"the VM shut down: complete, nothing to evacuate", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodSucceeded), VMI: vm(func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.VMISucceeded })},
			want{write: true, complete: true, outcome: OutcomeEnded, reason: ReasonVMEnded, heartbeat: at(0), message: "nothing to evacuate"}},
		{"the VMI is gone: complete", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning)},
			want{write: true, complete: true, outcome: OutcomeEnded, reason: ReasonVMEnded, heartbeat: at(0), message: "is gone"}},
		{"Canceled mid pre-copy, our mark: clear it (cancels the migration)", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateCanceled, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{clear: true, outcome: OutcomeCanceled, reason: ReasonCanceled, message: "migration vm-evacuation-x stops"}},
		{"Canceled mid auto-converge: still pre-copy, clear", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateCanceled, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModeAutoConverge)},
			want{clear: true, outcome: OutcomeCanceled, reason: ReasonCanceled}},
		{"Canceled in post-copy: cannot go back, say so", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateCanceled, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModePostCopy)},
			want{reason: ReasonNotCancelable, message: "cannot be cancelled"}},
		{"Canceled, the mark is the kubelet's: leave it", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateCanceled, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("NodePressure")), Migration: running}, want{}},
		{"Canceled, mark already cleared: nothing", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateCanceled, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm()}, want{}},
		{"Interrupted mid pre-copy, our mark: stop and clear it (the next responder takes the pod)", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateInterrupted, heartbeatAt(-25*time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: running},
			want{clear: true, outcome: OutcomeInterrupted, reason: ReasonInterrupted, message: "was interrupted and the next responder takes the pod"}},
		{"Interrupted in post-copy: cannot go back, say so", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateInterrupted, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")), Migration: migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModePostCopy)},
			want{reason: ReasonNotCancelable, message: "interrupted"}},
		{"Interrupted, the mark is now the pod deletion's: leave it, and say the evacuation goes on", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateInterrupted, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("PodDeleted")), Migration: running},
			want{outcome: OutcomeInterrupted, reason: ReasonInterrupted, message: "now marked for another cause (PodDeleted), so its evacuation from node a goes on"}},
		{"the migration found no node for its target: give the turn up, the mark stays", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")),
			Migration: unschedulable(at(0))},
			want{write: true, complete: true, outcome: OutcomeStalled, reason: ReasonStalled, heartbeat: at(0), message: "no node takes VM ns/vm: migration vm-evacuation-x failed (waited 5m0s for the target: 0/2 nodes are available)"}},
		{"a migration that found no node before this turn began: go on", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateActive, started()), Pod: launcherPod(corev1.PodRunning), VMI: vm(markedBy("EvictionRequest")),
			Migration: unschedulable(at(-time.Minute))},
			want{write: true, heartbeat: at(0), message: "failed", requeue: time.Minute}},
		{"Interrupted, a mark without its condition: no cause to name, still said", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateInterrupted, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodRunning),
			VMI: vm(func(v *v1alpha1.VirtualMachineInstance) { v.Status.EvacuationNodeName = v.Status.NodeName })},
			want{outcome: OutcomeInterrupted, reason: ReasonInterrupted, message: "marked for another cause (not recorded)"}},
		{"Completed: nothing", Observation{Eviction: eviction(lifecyclev1alpha1.ResponderStateCompleted, heartbeatAt(-time.Minute, progress)), Pod: launcherPod(corev1.PodSucceeded), VMI: vm(migratedTo("b"))}, want{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Decide(tc.obs, settings, t0)
			w := tc.want
			if (p.Mark != "") != w.mark || (p.ClearMark != "") != w.clear || (p.Write != nil) != w.write || p.Outcome != w.outcome || p.RequeueAfter != w.requeue {
				t.Fatalf("plan %+v (write %+v): want mark=%v clear=%v write=%v outcome=%q requeue=%s", p, p.Write, w.mark, w.clear, w.write, w.outcome, w.requeue)
			}
			if w.reason != "" && (len(p.Events) == 0 || p.Events[0].Reason != w.reason) {
				t.Errorf("events %+v: want reason %s", p.Events, w.reason)
			}
			if w.message != "" && !strings.Contains(planMessage(p), w.message) {
				t.Errorf("message %q: want it to contain %q", planMessage(p), w.message)
			}
			if p.Write == nil {
				return
			}
			if (p.Write.Completion != nil) != w.complete {
				t.Errorf("completionTime %v: want set=%v", p.Write.Completion, w.complete)
			}
			if w.complete && !p.Write.Completion.Equal(at(0)) {
				t.Errorf("completionTime %v: want now", p.Write.Completion)
			}
			if w.heartbeat != nil && !p.Write.Heartbeat.Equal(w.heartbeat) {
				t.Errorf("heartbeatTime %v: want %v", p.Write.Heartbeat, w.heartbeat)
			}
			if !w.complete && (p.Write.Expected == nil || p.Write.Expected.Time.Before(t0.Add(MinHeartbeatInterval))) {
				t.Errorf("expectedCompletionTime %v: want one, at least a heartbeat floor ahead", p.Write.Expected)
			}
		})
	}
}

func planMessage(p Plan) string {
	switch {
	case p.Write != nil:
		return p.Write.Message
	case p.ClearMark != "":
		return p.ClearMark
	case len(p.Events) > 0:
		return p.Events[0].Message
	}
	return ""
}

func TestExpectedCompletion(t *testing.T) {
	pod := launcherPod(corev1.PodRunning)
	cases := []struct {
		name string
		obs  Observation
		want time.Time
	}{
		{"no migration yet: set-up plus 1 GiB at 100 MiB/s from now", Observation{Pod: pod, VMI: vm()}, t0.Add(setupEstimate + 10240*time.Millisecond)},
		{"a running migration: counted from its creation", Observation{Pod: pod, VMI: vm(), Migration: func() *v1alpha1.VirtualMachineInstanceMigration {
			m := migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModePreCopy)
			m.CreationTimestamp = metav1.NewTime(t0.Add(-20 * time.Second))
			return m
		}()}, t0.Add(-20*time.Second + setupEstimate + 10240*time.Millisecond)},
		{"the cluster caps the bandwidth at 64 MiB/s", Observation{Pod: pod, VMI: vm(), Config: &v1alpha1.LifeboatConfig{Spec: v1alpha1.LifeboatConfigSpec{
			Migrations: v1alpha1.MigrationsConfig{BandwidthPerMigration: ptr.To(resource.MustParse("64Mi"))}}}}, t0.Add(setupEstimate + 16*time.Second)},
		{"a migration with a deadline: the deadline", Observation{Pod: pod, VMI: vm(), Migration: func() *v1alpha1.VirtualMachineInstanceMigration {
			m := migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModePreCopy)
			m.Status.Deadline = at(45 * time.Second)
			return m
		}()}, t0.Add(45 * time.Second)},
		{"migrated: the source pod's end", Observation{Pod: pod, VMI: vm(migratedTo("b"))}, t0.Add(sourceEndEstimate)},
		{"transfer figures: 96 MiB left gaining 32 MiB/s, read 1 s ago", Observation{Pod: pod, VMI: vm(), Migration: withProgress(nil, 96, 8, 40)}, t0.Add(2 * time.Second)},
		{"transfer figures past the deadline: the deadline", Observation{Pod: pod, VMI: vm(), Migration: withProgress(at(2*time.Second), 96, 8, 40)}, t0.Add(2 * time.Second)},
		{"the guest dirties faster than the transfer: no projection, the deadline", Observation{Pod: pod, VMI: vm(), Migration: withProgress(at(45*time.Second), 96, 50, 40)}, t0.Add(45 * time.Second)},
	}
	for _, tc := range cases {
		if got := expectedCompletion(tc.obs, t0); !got.Equal(tc.want) {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// withProgress is a running migration whose source agent read, a second ago, remaining MiB left
// with the guest dirtying and the transfer sending at the given MiB/s.
func withProgress(deadline *metav1.Time, remaining, dirty, bandwidth int64) *v1alpha1.VirtualMachineInstanceMigration {
	m := migration(v1alpha1.MigrationRunning, v1alpha1.MigrationModePreCopy)
	m.Status.Deadline = deadline
	m.Status.Progress = &v1alpha1.MigrationProgress{DataTotal: 256 << 20, DataRemaining: remaining << 20,
		MemoryDirtyRate: dirty << 20, MemoryBandwidth: bandwidth << 20, UpdateTime: metav1.NewTime(t0.Add(-time.Second))}
	return m
}
