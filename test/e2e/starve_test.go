package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/migration"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// TestATenantCannotStarveEvacuations (issue 45, N3): a tenant creates five migrations of its own
// VM whose target can go nowhere, and, all along, migrations in its own namespace that carry the
// labels of other tenants' VMs' evacuations and fail at once. With room for one evacuation in
// the whole cluster, another tenant's VM evicted by its kubelet for node pressure, then another
// one evicted through the API as a drain does, still move at once: neither the stuck migrations
// nor the forged failures count. The tenant's second to fifth migrations fail at once, saying
// why, and are counted.
func TestATenantCannotStarveEvacuations(t *testing.T) {
	const grace = 60
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		// One migration the tenant's counted would have starved every evacuation.
		c.Spec.Migrations.ParallelMigrationsPerCluster = ptr.To[int32](1)
	})
	metrics := startControllerWithWebhook(t).metrics
	const pin = "e2e.lifeboat.dev/pinned"
	source := startNodes(t, 1, func(c *node.Config) {
		c.Labels, c.EvictionMaxPodGracePeriod = map[string]string{pin: "yes"}, grace
	})[0]
	tenant, other := testNamespace(t), testNamespace(t)
	live := strategy(v1alpha1.EvictionStrategyLiveMigrate)
	// The tenant's VM may run only where it runs: a migration's target pod finds no node. A node
	// with the label that nothing reaches keeps it migratable (not NoTargetNode), so that the
	// tenant's migrations wait for the scheduler instead of failing at once.
	phantomNode(t, map[string]string{pin: "yes"})
	own := createVMI(t, tenant, newVMI("own", live, func(v *v1alpha1.VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{pin: "yes"} }))
	victim := createVMI(t, other, newVMI("victim", live, func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
	}))
	drained := createVMI(t, other, newVMI("drained", live))
	for _, v := range []*v1alpha1.VirtualMachineInstance{own, victim, drained} {
		v = waitVMI(t, v.Namespace, v.Name, 2*bootTimeout, "phase Running", running)
		waitCounterPast(t, source.consolePath(v), 0, bootTimeout)
	}
	victim = waitVMI(t, other, victim.Name, time.Second, "running", running)
	drained = waitVMI(t, other, drained.Name, time.Second, "running", running)
	target := startNodes(t, 1, func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })[0]

	// What the tenant may do with "create virtualmachineinstancemigrations" in its namespace;
	// the API server keeps any status it sends out of what it stores.
	migrations := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(tenant)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var stuck []string
	for i := range 5 {
		m, err := migrations.Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("stuck-%d", i)},
			Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: own.Name},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stuck = append(stuck, m.Name)
	}
	// Each names, in turn, one of the other tenant's VMs.
	forged := func(i int) error {
		v := []*v1alpha1.VirtualMachineInstance{victim, drained}[i%2]
		_, err := migrations.Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("forged-%d", i), Labels: map[string]string{
				v1alpha1.LabelVMIName: v.Name, v1alpha1.LabelVMIUID: string(v.UID), v1alpha1.LabelEvacuation: "true"}},
			Spec:   v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: v.Name},
			Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Evacuation: &v1alpha1.MigrationEvacuation{VMIUID: string(v.UID)}},
		}, metav1.CreateOptions{})
		return err
	}
	if err := forged(0); err != nil {
		t.Fatal(err)
	}
	forging := make(chan int, 1)
	go func() {
		i := 1
		defer func() { forging <- i }()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if forged(i) == nil {
					i++
				}
			}
		}
	}()

	// The first of the tenant's migrations waits for a node for its target; the others fail at once.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		first, err := migrations.Get(ctx, stuck[0], metav1.GetOptions{})
		if err != nil || first.Status.Phase != v1alpha1.MigrationScheduling {
			return false, nil
		}
		for _, name := range stuck[1:] {
			m, err := migrations.Get(ctx, name, metav1.GetOptions{})
			if err != nil || m.Status.Phase != v1alpha1.MigrationFailed {
				return false, nil
			}
		}
		f, err := migrations.Get(ctx, "forged-0", metav1.GetOptions{})
		return err == nil && f.Status.Phase == v1alpha1.MigrationFailed, nil
	})
	if err != nil {
		t.Fatalf("want %s waiting for its target, the tenant's other migrations and its forged one failed: %v", stuck[0], err)
	}
	for _, name := range stuck[1:] {
		m, err := migrations.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := "already migrating with migration " + stuck[0]; !strings.Contains(m.Status.FailureReason, want) || m.Status.Evacuation != nil {
			t.Errorf("migration %s failed with %q (record %+v); want the reason %q and no evacuation record", name, m.Status.FailureReason, m.Status.Evacuation, want)
		}
	}
	waitEvent(t, tenant, stuck[1], migration.ReasonRefused, 10*time.Second)
	if got := metricValue(t, metrics, `lifeboat_migrations_refused_total{refusal="Concurrent"}`); got < 4 {
		t.Errorf("lifeboat_migrations_refused_total{refusal=\"Concurrent\"} = %v, want at least the tenant's 4", got)
	}

	evicted := evict(t, source, victim)
	signalled := time.Now()
	moved := waitVMI(t, other, victim.Name, grace*time.Second, "running on "+target.Name()+" by a completed migration", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	t.Logf("the victim moved %s after its eviction", time.Since(signalled).Round(time.Millisecond))
	if s := moved.Status.MigrationState; s.Cause != v1alpha1.MigrationCauseNodePressure {
		t.Errorf("the victim's migration: %+v; want cause NodePressure", s)
	}
	// Its migration was made at once: no backoff after the forged failures.
	m := waitMigrationEnded(t, moved)
	if made := m.CreationTimestamp.Sub(signalled); made > 15*time.Second {
		t.Errorf("the victim's migration %s was created %s after the eviction; forged failures must not delay it", m.Name, made)
	}
	if err := evicted(); err != nil {
		t.Fatal(err)
	}

	// A drain's eviction of the other VM's pod: refused while lifeboat moves it, which it does at once.
	waitBudget(t, drained, 1)
	evictedAt := time.Now()
	if code, msg := evictPod(t, launcherPod(t, drained), false); code != 429 {
		t.Fatalf("evicting the drained VM's pod: %d %q, want 429 while lifeboat moves it", code, msg)
	}
	moved = waitVMI(t, other, drained.Name, time.Minute, "running on "+target.Name()+" by a completed migration", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(v) && v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	t.Logf("the drained VM moved %s after its eviction", time.Since(evictedAt).Round(time.Millisecond))
	stop()
	t.Logf("the tenant forged %d failures", <-forging)
	if s := moved.Status.MigrationState; s.Cause != v1alpha1.MigrationCauseAPIEviction {
		t.Errorf("the drained VM's migration: %+v; want cause APIEviction", s)
	}
	if m := waitMigrationEnded(t, moved); m.CreationTimestamp.Sub(evictedAt) > 15*time.Second {
		t.Errorf("the drained VM's migration %s was created %s after the eviction; forged failures must not delay it", m.Name, m.CreationTimestamp.Sub(evictedAt))
	}
	// All along, the tenant's first migration still waited for its target.
	if first, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(tenant).Get(context.Background(), stuck[0], metav1.GetOptions{}); err != nil || first.Status.Phase.Terminal() {
		t.Errorf("the tenant's migration %s should still wait for a node for its target: %+v, %v", stuck[0], first.Status, err)
	}
}
