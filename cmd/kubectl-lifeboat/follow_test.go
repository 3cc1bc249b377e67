package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestLiveLine(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 3, 4, 500_000_000, time.UTC)
	for _, tc := range []struct {
		name  string
		line  string
		tty   bool
		width int
		want  string
	}{
		{"piped: a line of its own after the time", "migration m: Running", false, 80, "02:03:04.5  migration m: Running\n"},
		{"piped: never cut", strings.Repeat("x", 100), false, 10, "02:03:04.5  " + strings.Repeat("x", 100) + "\n"},
		{"terminal: over the line before, clearing its end", "migration m: Running", true, 80, "\rmigration m: Running\x1b[K"},
		{"terminal: cut to its width, so that it does not wrap", "migration m: Running", true, 12, "\rmigration …\x1b[K"},
		{"terminal of unknown width: not cut", "migration m: Running", true, 0, "\rmigration m: Running\x1b[K"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := liveLine(tc.line, tc.tty, tc.width, now); got != tc.want {
				t.Errorf("liveLine(%q, tty %v, width %d) = %q, want %q", tc.line, tc.tty, tc.width, got, tc.want)
			}
		})
	}
}

// The follower redraws on a terminal and ends the drawn line before whole lines; piped, it
// prints each change once.
func TestFollowerRedrawsOnATerminal(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 3, 4, 0, time.UTC)
	for _, tc := range []struct {
		tty  bool
		want string
	}{
		{true, "\ra\x1b[K\rb\x1b[K\ndone\n"},
		{false, "02:03:04.0  a\n02:03:04.0  b\ndone\n"},
	} {
		var out bytes.Buffer
		p := &follower{out: &out, tty: tc.tty, width: 80}
		p.show("a", now)
		p.show("a", now)
		p.show("b", now)
		p.say("done\n")
		if out.String() != tc.want {
			t.Errorf("tty %v: printed %q, want %q", tc.tty, out.String(), tc.want)
		}
	}
}

func TestSummary(t *testing.T) {
	start := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	mig := func(phase v1alpha1.VirtualMachineInstanceMigrationPhase, reason string) *v1alpha1.VirtualMachineInstanceMigration {
		return &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "demo-migration-x", UID: "mig-uid"},
			Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase, Cause: v1alpha1.MigrationCauseManual, Mode: v1alpha1.MigrationModePreCopy,
				SourceNode: "node-a", TargetNode: "node-b", FailureReason: reason,
				StartTimestamp: &metav1.Time{Time: start}, EndTimestamp: &metav1.Time{Time: start.Add(9 * time.Second)}}}
	}
	vmi := func(node string, phase v1alpha1.VirtualMachineInstancePhase, state *v1alpha1.VirtualMachineInstanceMigrationState) *v1alpha1.VirtualMachineInstance {
		return &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: node, Phase: phase, MigrationState: state}}
	}
	state := func(uid string, downtime *int64) *v1alpha1.VirtualMachineInstanceMigrationState {
		return &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: uid, StartTimestamp: &metav1.Time{Time: start.Add(time.Second)},
			EndTimestamp: &metav1.Time{Time: start.Add(8*time.Second + 250*time.Millisecond)}, Completed: true, DowntimeMilliseconds: downtime}
	}
	for _, tc := range []struct {
		name string
		f    followed
		want string
	}{
		{"moved, the stop time recorded", followed{ns: "ns", name: "demo", m: mig(v1alpha1.MigrationSucceeded, ""), i: vmi("node-b", v1alpha1.VMIRunning, state("mig-uid", ptr.To[int64](42)))},
			"VM ns/demo now runs on node node-b: migration demo-migration-x moved it from node node-a in 7.25s (cause Manual, mode PreCopy)\n" +
				"the guest stood still for 42ms (libvirt's figure, recorded by node node-b's agent)\n"},
		{"moved, no stop time recorded", followed{ns: "ns", name: "demo", m: mig(v1alpha1.MigrationSucceeded, ""), i: vmi("node-b", v1alpha1.VMIRunning, state("mig-uid", nil))},
			"VM ns/demo now runs on node node-b: migration demo-migration-x moved it from node node-a in 7.25s (cause Manual, mode PreCopy)\n" +
				"the guest stood still for: not reported (node node-b's agent recorded no downtime)\n"},
		{"moved, the VMI records another migration: the migration's own times, no stop time", followed{ns: "ns", name: "demo", m: mig(v1alpha1.MigrationSucceeded, ""), i: vmi("node-b", v1alpha1.VMIRunning, state("other", ptr.To[int64](42)))},
			"VM ns/demo now runs on node node-b: migration demo-migration-x moved it from node node-a in 9s (cause Manual, mode PreCopy)\n" +
				"the guest stood still for: not reported (node node-b's agent recorded no downtime)\n"},
		{"failed: why, and where the VM still runs", followed{ns: "ns", name: "demo", m: mig(v1alpha1.MigrationFailed, "the target refused"), i: vmi("node-a", v1alpha1.VMIRunning, nil)},
			"migration demo-migration-x failed: the target refused\nVM ns/demo keeps running on node node-a\n"},
		{"failed, and the VM does not run", followed{ns: "ns", name: "demo", m: mig(v1alpha1.MigrationFailed, ""), i: vmi("node-a", v1alpha1.VMIFailed, nil)},
			"migration demo-migration-x failed: no reason recorded\nVM ns/demo is Failed on node \"node-a\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summary(tc.f); got != tc.want {
				t.Errorf("summary:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// syncBuffer is an output a command writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runAsync runs kubectl lifeboat ARGS against the test's API server; its error comes on the channel.
func runAsync(args ...string) (*syncBuffer, <-chan error) {
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(append(args, "--kubeconfig", cluster.Kubeconfig), out) }()
	return out, done
}

// `kubectl lifeboat follow VM`, piped, against the real API server: the statuses lifeboat's
// agents would write, written by the test. It ignores the migration over before it began,
// prints a timestamped line per change of the next, and once the VM runs on the target says
// where, how long it took and how long the guest stood still.
func TestFollowPrintsTheMigrationUntilTheGuestRunsOnTheTarget(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "follow-")
	makeVM(t, ns, "mover", nil, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})
	lb := cluster.Lifeboat.LifeboatV1alpha1()
	vmi, err := lb.VirtualMachineInstances(ns).Get(ctx, "mover", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	earlier := makeMigration(t, ns, "mover-earlier", "mover")
	setMigration(t, ns, earlier.Name, func(s *v1alpha1.VirtualMachineInstanceMigrationStatus) {
		s.Phase, s.FailureReason = v1alpha1.MigrationFailed, "an earlier failure"
	})

	out, done := runAsync("follow", "mover", "-n", ns, "--timeout", "1m")
	waitOutput(t, out, "following VM "+ns+"/mover, running on node status-node-1\n")
	waitOutput(t, out, "waiting for a migration of VM "+ns+"/mover (on node status-node-1)\n")

	m := makeMigration(t, ns, "mover-now", "mover")
	start := metav1.Now()
	setMigration(t, ns, m.Name, func(s *v1alpha1.VirtualMachineInstanceMigrationStatus) {
		s.Phase, s.Cause, s.Mode, s.SourceNode, s.TargetNode, s.StartTimestamp = v1alpha1.MigrationRunning, v1alpha1.MigrationCauseManual, v1alpha1.MigrationModePreCopy, "status-node-1", "status-node-2", &start
		s.Progress = &v1alpha1.MigrationProgress{DataTotal: 1 << 30, DataRemaining: 512 << 20, MemoryDirtyRate: 4 << 20, MemoryBandwidth: 32 << 20, UpdateTime: start}
	})
	waitOutput(t, out, "  migration mover-now: Running         cause Manual, mode PreCopy, 512.0 MiB of 1024.0 MiB left, dirtying 4.0 MiB/s, sending 32.0 MiB/s\n")

	// The source agent records the outcome (the VMI first), then the target's the stop time.
	end := metav1.NewTime(start.Add(3 * time.Second))
	vmi.Status.NodeName = "status-node-2"
	vmi.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: m.Name, MigrationUID: string(m.UID),
		SourceNode: "status-node-1", TargetNode: "status-node-2", StartTimestamp: &start, EndTimestamp: &end, Completed: true,
		Mode: v1alpha1.MigrationModePreCopy, Cause: v1alpha1.MigrationCauseManual}
	if vmi, err = lb.VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setMigration(t, ns, m.Name, func(s *v1alpha1.VirtualMachineInstanceMigrationStatus) {
		s.Phase, s.EndTimestamp = v1alpha1.MigrationSucceeded, &end
	})
	waitOutput(t, out, "  migration mover-now: Succeeded       cause Manual, mode PreCopy\n")
	vmi.Status.MigrationState.DowntimeMilliseconds = ptr.To[int64](37)
	if _, err = lb.VirtualMachineInstances(ns).UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, done); err != nil {
		t.Fatalf("kubectl lifeboat follow: %v; it printed:\n%s", err, out)
	}
	for _, want := range []string{
		"VM " + ns + "/mover now runs on node status-node-2: migration mover-now moved it from node status-node-1 in 3s (cause Manual, mode PreCopy)\n" +
			"the guest stood still for 37ms (libvirt's figure, recorded by node status-node-2's agent)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("follow printed:\n%s\nwant %q", out, want)
		}
	}
	if strings.Contains(out.String(), "earlier") {
		t.Errorf("follow printed the migration over before it began:\n%s", out)
	}
	// status tells it too, under the latest migration.
	if status := runStatus(t, ns, "mover"); !strings.Contains(status, "migration mover-now: Succeeded       cause Manual, mode PreCopy\n  the guest stood still for 37ms (libvirt's figure)\n") {
		t.Errorf("status after the migration lacks the guest's downtime")
	}
}

// `kubectl lifeboat migrate VM --wait` creates the migration and follows it; when it fails the
// command says why and where the VM still runs, and exits 1. Past --timeout it gives up.
func TestMigrateWaitSaysWhyTheMigrationFailed(t *testing.T) {
	ns := cluster.Namespace(t, "migrate-wait-")
	makeVM(t, ns, "stayer", nil, metav1.Condition{Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable"})

	out, done := runAsync("migrate", "stayer", "-n", ns, "--wait", "--timeout", "1m")
	waitOutput(t, out, "VM "+ns+"/stayer is migrating from node status-node-1: migration stayer-migration-")
	name := strings.Fields(strings.SplitN(out.String(), "migration ", 2)[1])[0]
	setMigration(t, ns, name, func(s *v1alpha1.VirtualMachineInstanceMigrationStatus) {
		s.Phase, s.Cause, s.SourceNode, s.TargetNode = v1alpha1.MigrationFailed, v1alpha1.MigrationCauseManual, "status-node-1", "status-node-2"
		s.FailureReason = "no node fits the VM"
	})
	err := waitDone(t, done)
	if !errors.Is(err, errMigrationFailed) {
		t.Errorf("kubectl lifeboat migrate --wait of a failed migration: %v, want errMigrationFailed (exit status 1)", err)
	}
	for _, want := range []string{"  migration " + name + ": Failed          cause Manual: no node fits the VM\n",
		"migration " + name + " failed: no node fits the VM\nVM " + ns + "/stayer keeps running on node status-node-1\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("migrate --wait printed:\n%s\nwant %q", out, want)
		}
	}

	out, done = runAsync("migrate", "stayer", "-n", ns, "--wait", "--timeout", "2s")
	err = waitDone(t, done)
	if err == nil || !strings.Contains(err.Error(), "no migration ended within 2s; last seen: migration stayer-migration-") {
		t.Errorf("kubectl lifeboat migrate --wait past its timeout: %v; want an error with what it saw last; it printed:\n%s", err, out)
	}
}

func makeMigration(t *testing.T, ns, name, vmi string) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	m, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).Create(context.Background(), &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func setMigration(t *testing.T, ns, name string, change func(*v1alpha1.VirtualMachineInstanceMigrationStatus)) {
	t.Helper()
	migrations := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	m, err := migrations.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	change(&m.Status)
	if _, err := migrations.UpdateStatus(context.Background(), m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(out.String(), want), nil
	})
	if err != nil {
		t.Fatalf("the command never printed %q; it printed:\n%s", want, out)
	}
}

func waitDone(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the command did not end within a minute")
		return nil
	}
}
