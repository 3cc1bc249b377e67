package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// newWritesAgent is an agent on node with a fake client holding objects, its informers synced.
func newWritesAgent(t *testing.T, node string, objects ...runtime.Object) (*Agent, *lifeboatfake.Clientset) {
	t.Helper()
	client := lifeboatfake.NewSimpleClientset(objects...)
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	a, err := New(Config{NodeName: node, Recorder: record.NewFakeRecorder(10), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister()},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	informers.Start(ctx.Done())
	informers.WaitForCacheSync(ctx.Done())
	return a, client
}

// calls counts the client's calls of verb on resource.
func calls(client *lifeboatfake.Clientset, verb, resource string) int {
	n := 0
	for _, act := range client.Actions() {
		if act.GetVerb() == verb && act.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// A status write starts from the informer's copy: one call, no GET; a conflict makes it read the
// object fresh and write again.
func TestStatusWritesStartFromTheInformersCopy(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm"}}
	vmi.Status.NodeName = "source"
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "uid-mig"}}
	a, client := newWritesAgent(t, "source", vmi, mig)
	ctx := t.Context()
	count := func(verb, resource string) int { return calls(client, verb, resource) }
	client.ClearActions()
	if err := a.migrations.updateVMI(ctx, "ns", "vm", func(v *v1alpha1.VirtualMachineInstance) { v.Status.Reason = "one" }); err != nil {
		t.Fatal(err)
	}
	if err := a.migrations.updateMigration(ctx, "ns", "mig", func(m *v1alpha1.VirtualMachineInstanceMigration) { m.Status.FailureReason = "one" }); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"virtualmachineinstances", "virtualmachineinstancemigrations"} {
		if gets, updates := count("get", r), count("update", r); gets != 0 || updates != 1 {
			t.Errorf("a status write of %s: %d GETs and %d updates, want none and one", r, gets, updates)
		}
	}

	// The API server refuses the cached copy once, as it would a stale one.
	conflicted := false
	client.PrependReactor("update", "virtualmachineinstances", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicted {
			return false, nil, nil
		}
		conflicted = true
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupName, Resource: "virtualmachineinstances"}, "vm", nil)
	})
	client.ClearActions()
	if err := a.migrations.updateVMI(ctx, "ns", "vm", func(v *v1alpha1.VirtualMachineInstance) { v.Status.Reason = "two" }); err != nil {
		t.Fatal(err)
	}
	if gets, updates := count("get", "virtualmachineinstances"), count("update", "virtualmachineinstances"); gets != 1 || updates != 2 {
		t.Errorf("a write refused for a conflict: %d GETs and %d updates, want a fresh read and a second write", gets, updates)
	}
	got, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(ctx, "vm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Reason != "two" {
		t.Errorf("after the retry the reason is %q; want the change written", got.Status.Reason)
	}
}

// A migration's target waits for its launcher (to connect, to load QEMU's capabilities) by
// retrying; the VMI, which its informer does not hold (it lists this node's VMIs), is read once
// for the migration, not on every retry, and forgotten with the migration.
func TestATargetReadsTheMigrationsVMIOnce(t *testing.T) {
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "uid-mig"},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
	mig.Status.SourceNode, mig.Status.TargetNode, mig.Status.Phase = "source", "target", v1alpha1.MigrationPreparingTarget
	a, client := newWritesAgent(t, "target", mig)
	// The VMI is on the source node: the API server has it, the target's informer does not.
	client.PrependReactor("get", "virtualmachineinstances", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm"}}, nil
	})
	client.ClearActions()
	for range 3 {
		var waiting *notYetError
		if err := a.migrations.prepareTarget(t.Context(), mig); !errors.As(err, &waiting) || !strings.Contains(err.Error(), "to connect") {
			t.Fatalf("prepareTarget with no launcher connected = %v, want it to wait for the launcher to connect", err)
		}
	}
	if gets := calls(client, "get", "virtualmachineinstances"); gets != 1 {
		t.Errorf("three tries of the target read the VMI %d times, want once", gets)
	}
	a.migrations.finishByKey("ns/mig")
	if n := len(a.migrations.vmiUIDs); n != 0 {
		t.Errorf("after the migration ended the agent still remembers %d VMIs for it", n)
	}
}

// madeAhead is a VMI on node source and its migration to node target, made ahead of a free
// parallel-migration slot and waiting at TargetReady, following the migration with UID after.
func madeAhead(after string) (*v1alpha1.VirtualMachineInstance, *v1alpha1.VirtualMachineInstanceMigration) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm"}}
	vmi.Status.NodeName = "source"
	return vmi, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "uid-mig"},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"},
		Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationTargetReady, SourceNode: "source", TargetNode: "target",
			TargetProxy: &v1alpha1.MigrationProxy{Libvirt: "127.0.0.1:1", Memory: "127.0.0.1:2"},
			Evacuation:  &v1alpha1.MigrationEvacuation{VMIUID: "uid-vm", WaitingForSlot: true, SlotAfterUID: after}}}
}

// A migration made ahead of a free parallel-migration slot waits at TargetReady: its source
// agent starts nothing (no call at all) until the evacuation controller gives it the slot.
func TestASourceWaitsForItsSlot(t *testing.T) {
	vmi, mig := madeAhead("")
	a, client := newWritesAgent(t, "source", vmi, mig)
	client.ClearActions()
	if _, err := a.migrations.sync(t.Context(), "ns/mig"); err != nil {
		t.Errorf("a migration waiting for its slot: %v; want it left to wait", err)
	}
	if acts := client.Actions(); len(acts) != 0 {
		t.Errorf("the source agent made %d calls for a migration waiting for its slot, want none: %v", len(acts), acts)
	}

	// Given the slot, the source starts: here it finds no launcher to migrate from.
	mig.Status.Evacuation.WaitingForSlot = false
	if _, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").UpdateStatus(t.Context(), mig, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		m, _ := a.migrations.get("ns", "mig")
		return m != nil && !m.WaitingForSlot(), nil
	})
	if err != nil {
		t.Fatal("the agent's informer does not show the slot given within 5s")
	}
	_, err = a.migrations.sync(t.Context(), "ns/mig")
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("given its slot, the source agent's start: %v; want it to try (and find no launcher connected)", err)
	}
}

// A migration made ahead that follows another (status.evacuation.slotAfterUID) starts when that
// one's transfer ends on this node, without the controller's release; the end of any other
// migration leaves it waiting, and a second follower of the same one (statuses out of step)
// does not take the slot too.
func TestAFollowerStartsWhenTheTransferItFollowsEndsHere(t *testing.T) {
	vmi, mig := madeAhead("uid-first")
	second := mig.DeepCopy()
	second.Name, second.UID = "second", "uid-second"
	a, client := newWritesAgent(t, "source", vmi, mig, second)
	queue := a.migrations.queue
	drain := func() {
		for queue.Len() > 0 {
			k, _ := queue.Get()
			queue.Forget(k)
			queue.Done(k)
		}
	}
	drain()
	client.ClearActions()

	a.migrations.transferDone("uid-other")
	if n := queue.Len(); n != 0 {
		t.Errorf("another migration's end queued %d migrations, want none", n)
	}
	if _, err := a.migrations.sync(t.Context(), "ns/mig"); err != nil {
		t.Errorf("a follower whose migration still runs: %v; want it left to wait", err)
	}
	if acts := client.Actions(); len(acts) != 0 {
		t.Errorf("the source agent made %d calls for a follower whose migration still runs, want none: %v", len(acts), acts)
	}

	a.migrations.transferDone("uid-first")
	if n := queue.Len(); n != 2 {
		t.Fatalf("the followed migration's end queued %d migrations, want its two followers", n)
	}
	drain()
	_, err := a.migrations.sync(t.Context(), "ns/mig")
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("its slot freed here, the follower's start: %v; want it to try (and find no launcher connected)", err)
	}
	client.ClearActions()
	if _, err := a.migrations.sync(t.Context(), "ns/second"); err != nil {
		t.Errorf("a second follower of the same migration: %v; want it left to wait", err)
	}
	if acts := client.Actions(); len(acts) != 0 {
		t.Errorf("the source agent made %d calls for a second follower of one slot, want none: %v", len(acts), acts)
	}
	// The first tries again (its launcher was not connected): the slot is still its own.
	if _, err := a.migrations.sync(t.Context(), "ns/mig"); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("the follower's second try: %v; want it to try again", err)
	}
}
