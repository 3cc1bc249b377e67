package agent

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

var t0 = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

type vmiOpt func(*v1alpha1.VirtualMachineInstance)

func testVMI(phase v1alpha1.VirtualMachineInstancePhase, opts ...vmiOpt) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns"}}
	v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](20)
	v.Status.Phase = phase
	v.Status.NodeName = "node-1"
	for _, o := range opts {
		o(v)
	}
	return v
}

func deletedAt(t time.Time) vmiOpt {
	return func(v *v1alpha1.VirtualMachineInstance) { v.DeletionTimestamp = ptr.To(metav1.NewTime(t)) }
}

// withNoTargetNode: the evacuation controller found no other node to take the VM.
func withNoTargetNode(v *v1alpha1.VirtualMachineInstance) {
	meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionFalse,
		Reason: v1alpha1.VMIReasonNoTargetNode, Message: "no other node labelled lifeboat.dev/kvm=true matches its nodeSelector kubernetes.io/hostname=node-1"})
}

func TestDecide(t *testing.T) {
	sigterm := t0
	cases := []struct {
		name         string
		vmi          *v1alpha1.VirtualMachineInstance
		dom          *Domain
		now          time.Time
		wantPhase    v1alpha1.VirtualMachineInstancePhase
		wantReady    metav1.ConditionStatus
		wantMigrates metav1.ConditionStatus
		wantShutdown bool
		wantDestroy  bool
		wantRequeue  time.Duration
		wantEvent    string
	}{
		{name: "no domain yet: nothing to say", vmi: testVMI(v1alpha1.VMIScheduled), now: t0, wantPhase: ""},
		{name: "running domain makes the VMI Running and Ready", vmi: testVMI(v1alpha1.VMIScheduled), dom: &Domain{State: DomainRunning}, now: t0,
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionTrue, wantEvent: ReasonStarted},
		{name: "a disk on the node makes it not migratable, with the reason", vmi: testVMI(v1alpha1.VMIRunning), dom: &Domain{State: DomainRunning, NotMigratableReason: "LocalDisk"}, now: t0,
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionFalse},
		{name: "the controller's NoTargetNode stands while the domain could move", vmi: testVMI(v1alpha1.VMIRunning, withNoTargetNode), dom: &Domain{State: DomainRunning}, now: t0,
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionFalse},
		{name: "the domain's own reason replaces NoTargetNode", vmi: testVMI(v1alpha1.VMIRunning, withNoTargetNode), dom: &Domain{State: DomainRunning, NotMigratableReason: "LocalDisk"}, now: t0,
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionFalse},
		{name: "crashed guest: Failed", vmi: testVMI(v1alpha1.VMIRunning), dom: &Domain{State: DomainCrashed}, now: t0,
			wantPhase: v1alpha1.VMIFailed, wantReady: metav1.ConditionFalse, wantEvent: ReasonGuestCrashed},
		{name: "deleted VMI: power button, look again at the deadline", vmi: testVMI(v1alpha1.VMIRunning, deletedAt(t0)), dom: &Domain{State: DomainRunning}, now: t0.Add(5 * time.Second),
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionTrue, wantShutdown: true, wantRequeue: 15 * time.Second, wantEvent: ReasonShuttingDown},
		{name: "deleted VMI, button already pressed: only wait", vmi: testVMI(v1alpha1.VMIRunning, deletedAt(t0)), dom: &Domain{State: DomainShuttingDown, ShutdownSent: true}, now: t0.Add(10 * time.Second),
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionTrue, wantRequeue: 10 * time.Second},
		{name: "deleted VMI past its grace: destroy", vmi: testVMI(v1alpha1.VMIRunning, deletedAt(t0)), dom: &Domain{State: DomainRunning, ShutdownSent: true}, now: t0.Add(20 * time.Second),
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionTrue, wantDestroy: true, wantEvent: ReasonDestroyed},
		{name: "SIGTERM recorded by the launcher: graceful shutdown from the signal time", vmi: testVMI(v1alpha1.VMIRunning), dom: &Domain{State: DomainRunning, GracefulShutdown: &sigterm}, now: t0.Add(2 * time.Second),
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionTrue, wantMigrates: metav1.ConditionTrue, wantShutdown: true, wantRequeue: 18 * time.Second, wantEvent: ReasonShuttingDown},
		{name: "guest powered off: not Ready, phase left to the pod", vmi: testVMI(v1alpha1.VMIRunning), dom: &Domain{State: DomainShutoff}, now: t0,
			wantPhase: v1alpha1.VMIRunning, wantReady: metav1.ConditionFalse},
		{name: "terminal VMI: nothing", vmi: testVMI(v1alpha1.VMISucceeded), dom: &Domain{State: DomainShutoff}, now: t0, wantPhase: ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Decide(tc.vmi, tc.dom, Eviction{}, "node-1", tc.now)
			if tc.wantPhase == "" {
				if plan.Status != nil || plan.Shutdown || plan.Destroy {
					t.Fatalf("want no action, got %+v", plan)
				}
				return
			}
			if plan.Status == nil {
				t.Fatal("want a status")
			}
			if plan.Status.Phase != tc.wantPhase {
				t.Errorf("phase = %s, want %s", plan.Status.Phase, tc.wantPhase)
			}
			for typ, want := range map[string]metav1.ConditionStatus{v1alpha1.VMIConditionReady: tc.wantReady, v1alpha1.VMIConditionLiveMigratable: tc.wantMigrates} {
				c := meta.FindStatusCondition(plan.Status.Conditions, typ)
				switch {
				case want == "" && c != nil:
					t.Errorf("condition %s = %s, want none", typ, c.Status)
				case want != "" && (c == nil || c.Status != want):
					t.Errorf("condition %s = %+v, want %s", typ, c, want)
				}
			}
			if plan.Shutdown != tc.wantShutdown || plan.Destroy != tc.wantDestroy || plan.RequeueAfter != tc.wantRequeue {
				t.Errorf("shutdown=%v destroy=%v requeue=%s, want %v %v %s", plan.Shutdown, plan.Destroy, plan.RequeueAfter, tc.wantShutdown, tc.wantDestroy, tc.wantRequeue)
			}
			var reasons []string
			for _, e := range plan.Events {
				reasons = append(reasons, e.Reason)
			}
			if got := strings.Join(reasons, ","); got != tc.wantEvent {
				t.Errorf("events = %q, want %q", got, tc.wantEvent)
			}
		})
	}
}

// A guest left paused on arrival runs only where its VMI's last migration brought it and was
// recorded complete: the source gave it up. Anywhere else (a migration still under way, one that
// failed, a convergence pause on the source) a paused guest is not the agent's to run.
func TestDecideRunsAGuestThatArrivedPausedOnlyOnceItsSourceGaveItUp(t *testing.T) {
	migrated := func(target string, completed bool) vmiOpt {
		return func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-2", TargetNode: target, Completed: completed, Failed: !completed}
		}
	}
	onNode := func(n string) vmiOpt { return func(v *v1alpha1.VirtualMachineInstance) { v.Status.NodeName = n } }
	for _, tc := range []struct {
		name       string
		vmi        *v1alpha1.VirtualMachineInstance
		dom        Domain
		wantResume bool
	}{
		{"arrived here, recorded complete, paused by the migration", testVMI(v1alpha1.VMIRunning, migrated("node-1", true)), Domain{State: DomainPaused, PausedUser: true}, true},
		{"arrived here and already running", testVMI(v1alpha1.VMIRunning, migrated("node-1", true)), Domain{State: DomainRunning}, false},
		{"paused for another reason (an I/O error)", testVMI(v1alpha1.VMIRunning, migrated("node-1", true)), Domain{State: DomainPaused}, false},
		{"the migration here failed: the source runs the guest", testVMI(v1alpha1.VMIRunning, onNode("node-2"), migrated("node-1", false)), Domain{State: DomainPaused, PausedUser: true}, false},
		{"a migration here not recorded yet", testVMI(v1alpha1.VMIRunning, onNode("node-2")), Domain{State: DomainPaused, PausedUser: true}, false},
		{"a migration away, paused to converge", testVMI(v1alpha1.VMIRunning, migrated("node-3", false)), Domain{State: DomainPaused, PausedUser: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := Decide(tc.vmi, &tc.dom, Eviction{}, "node-1", t0)
			if plan.Resume != tc.wantResume {
				t.Fatalf("resume = %v, want %v (%+v)", plan.Resume, tc.wantResume, plan)
			}
			if tc.wantResume && (len(plan.Events) == 0 || plan.Events[0].Reason != ReasonResumedOnArrival || plan.Events[0].Type != corev1.EventTypeWarning) {
				t.Errorf("events %+v: want a %s Warning first", plan.Events, ReasonResumedOnArrival)
			}
		})
	}
}

// Every migration that brought its guest here says when the guest ran here: the launcher's report
// records it while the migration runs, and the agent's look at a running guest does if the source
// recorded the migration complete first. A paused arrival, a failed migration or one away does not.
func TestDecideRecordsWhenAnArrivedGuestRuns(t *testing.T) {
	earlier := metav1.NewTime(t0.Add(-time.Minute))
	state := func(target string, completed bool, ready *metav1.Time) vmiOpt {
		return func(v *v1alpha1.VirtualMachineInstance) {
			v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-2", TargetNode: target,
				Completed: completed, Failed: !completed, TargetNodeDomainReadyTimestamp: ready}
		}
	}
	for _, tc := range []struct {
		name  string
		vmi   *v1alpha1.VirtualMachineInstance
		state DomainState
		want  *metav1.Time
	}{
		{"arrived, running, not recorded yet", testVMI(v1alpha1.VMIRunning, state("node-1", true, nil)), DomainRunning, ptr.To(metav1.NewTime(t0))},
		{"arrived, recorded by the launcher's report", testVMI(v1alpha1.VMIRunning, state("node-1", true, &earlier)), DomainRunning, &earlier},
		{"arrived paused: not running yet", testVMI(v1alpha1.VMIRunning, state("node-1", true, nil)), DomainPaused, nil},
		{"the migration here failed", testVMI(v1alpha1.VMIRunning, state("node-1", false, nil)), DomainRunning, nil},
		{"a migration away", testVMI(v1alpha1.VMIRunning, state("node-3", true, nil)), DomainRunning, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := Decide(tc.vmi, &Domain{State: tc.state}, Eviction{}, "node-1", t0)
			if plan.Status == nil || plan.Status.MigrationState == nil {
				t.Fatalf("plan %+v: want a status with the migration state", plan)
			}
			got := plan.Status.MigrationState.TargetNodeDomainReadyTimestamp
			if (got == nil) != (tc.want == nil) || (got != nil && !got.Equal(tc.want)) {
				t.Errorf("targetNodeDomainReadyTimestamp = %v, want %v", got, tc.want)
			}
		})
	}
}

// A VMI that ended while its guest still runs here (its node was declared lost, and the VM may
// start elsewhere) has its guest destroyed, whatever the agent last knew: an ended VMI never
// runs again.
func TestDecideDestroysTheGuestOfAnEndedVMI(t *testing.T) {
	for _, tc := range []struct {
		name        string
		vmi         *v1alpha1.VirtualMachineInstance
		state       DomainState
		wantDestroy bool
	}{
		{"Failed, guest running", testVMI(v1alpha1.VMIFailed), DomainRunning, true},
		{"Failed, guest paused", testVMI(v1alpha1.VMIFailed), DomainPaused, true},
		{"Succeeded, guest running", testVMI(v1alpha1.VMISucceeded), DomainRunning, true},
		{"Failed, guest shut off", testVMI(v1alpha1.VMIFailed), DomainShutoff, false},
		{"Running: the guest is the VMI's", testVMI(v1alpha1.VMIRunning), DomainRunning, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := Decide(tc.vmi, &Domain{State: tc.state}, Eviction{}, "node-1", t0)
			if plan.Destroy != tc.wantDestroy {
				t.Fatalf("destroy = %v, want %v (%+v)", plan.Destroy, tc.wantDestroy, plan)
			}
			if !tc.wantDestroy {
				return
			}
			if plan.Status != nil || plan.StrayReason != StrayVMIEnded || len(plan.Events) != 1 || plan.Events[0].Reason != ReasonStrayGuestDestroyed ||
				!strings.Contains(plan.Events[0].Message, "never runs beside another copy") {
				t.Errorf("plan %+v: want no status write, stray reason %s and one %s Event", plan, StrayVMIEnded, ReasonStrayGuestDestroyed)
			}
		})
	}
}

func TestWhatAMigrationLeavesAndCopies(t *testing.T) {
	cloudInit := v1alpha1.Volume{Name: "cloudinit", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config"}}
	rootDisk := v1alpha1.Volume{Name: "root", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.org/fedora:42"}}
	claim := v1alpha1.Volume{Name: "data", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "db-disk"}}
	podNetwork := []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	claimModes := func(m corev1.PersistentVolumeAccessMode) []v1alpha1.VolumeStatus {
		return []v1alpha1.VolumeStatus{{Name: "data", PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{ClaimName: "db-disk", AccessModes: []corev1.PersistentVolumeAccessMode{m}}}}
	}
	for _, tc := range []struct {
		name          string
		spec          v1alpha1.VirtualMachineInstanceSpec
		reason, names string
		copies        bool
		claims        []v1alpha1.VolumeStatus
	}{
		{name: "kernel from an image and a cloud-init seed: migratable",
			spec: v1alpha1.VirtualMachineInstanceSpec{Boot: v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "k", KernelPath: "/vmlinuz"}}, Volumes: []v1alpha1.Volume{cloudInit}}},
		{name: "a node file as disk", spec: v1alpha1.VirtualMachineInstanceSpec{Boot: v1alpha1.BootSource{Disk: "/images/root.img"}},
			reason: ReasonLocalDisk, names: `"/images/root.img"`},
		{name: "a containerDisk, whose overlay is copied", spec: v1alpha1.VirtualMachineInstanceSpec{Volumes: []v1alpha1.Volume{cloudInit, rootDisk}}, copies: true},
		{name: "a ReadWriteMany claim stays, shared", spec: v1alpha1.VirtualMachineInstanceSpec{Volumes: []v1alpha1.Volume{claim}}, claims: claimModes(corev1.ReadWriteMany)},
		{name: "a ReadWriteOnce claim keeps the VM", spec: v1alpha1.VirtualMachineInstanceSpec{Volumes: []v1alpha1.Volume{claim}}, claims: claimModes(corev1.ReadWriteOnce),
			reason: ReasonDisksNotLiveMigratable, names: `persistentVolumeClaim "db-disk" (volume "data") is not ReadWriteMany`},
		{name: "masquerade on the pod network moves", spec: v1alpha1.VirtualMachineInstanceSpec{
			Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}, Networks: podNetwork}},
		{name: "a bridge binding on the pod network keeps the VM", spec: v1alpha1.VirtualMachineInstanceSpec{
			Interfaces: []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}, Networks: podNetwork},
			reason: ReasonInterfaceNotLiveMigratable, names: `interface "default" has the bridge binding`},
		{name: "a claim not recorded yet keeps the VM", spec: v1alpha1.VirtualMachineInstanceSpec{Volumes: []v1alpha1.Volume{claim}},
			reason: ReasonDisksNotLiveMigratable, names: `persistentVolumeClaim "db-disk" (volume "data"): its access modes are not recorded yet`},
		// Each message says what would let the VM move, in words an admin acts on.
		{name: "a ReadWriteOnce claim: its modes, and what to do", spec: v1alpha1.VirtualMachineInstanceSpec{Volumes: []v1alpha1.Volume{claim}}, claims: claimModes(corev1.ReadWriteOnce),
			reason: ReasonDisksNotLiveMigratable, names: `(its access modes: [ReadWriteOnce]): the target node cannot mount it while the source does; copy the disk to a ReadWriteMany claim`},
		{name: "a node file: what to do", spec: v1alpha1.VirtualMachineInstanceSpec{Boot: v1alpha1.BootSource{Disk: "/images/root.img"}},
			reason: ReasonLocalDisk, names: `put the disk in a containerDisk image or on a ReadWriteMany persistentVolumeClaim`},
		{name: "a bridge binding: what to do", spec: v1alpha1.VirtualMachineInstanceSpec{
			Interfaces: []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}, Networks: podNetwork},
			reason: ReasonInterfaceNotLiveMigratable, names: `use the masquerade binding`},
		{name: "a claim not recorded: where to look", spec: v1alpha1.VirtualMachineInstanceSpec{Volumes: []v1alpha1.Volume{claim}},
			reason: ReasonDisksNotLiveMigratable, names: `kubectl get pvc db-disk`},
		{name: "every obstacle is named, the first one's reason given", spec: v1alpha1.VirtualMachineInstanceSpec{
			Boot: v1alpha1.BootSource{Disk: "/images/root.img"}, Volumes: []v1alpha1.Volume{claim},
			Interfaces: []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}, Networks: podNetwork}, claims: claimModes(corev1.ReadWriteOnce),
			reason: ReasonLocalDisk, names: `to let the VM move; and interface "default" has the bridge binding on the pod network: the guest has the pod's address, and the target pod another; use the masquerade binding (the guest keeps its address behind the pod's) to let the VM move; and persistentVolumeClaim "db-disk" (volume "data") is not ReadWriteMany`},
	} {
		vmi := &v1alpha1.VirtualMachineInstance{Spec: tc.spec, Status: v1alpha1.VirtualMachineInstanceStatus{VolumeStatus: tc.claims}}
		reason, message := NotMigratable(vmi)
		if reason != tc.reason || !strings.Contains(message, tc.names) {
			t.Errorf("%s: NotMigratable = %q, %q; want reason %q and a message naming %s", tc.name, reason, message, tc.reason, tc.names)
		}
		if got := CopiesDisks(vmi); got != tc.copies {
			t.Errorf("%s: CopiesDisks = %v, want %v", tc.name, got, tc.copies)
		}
	}
}
