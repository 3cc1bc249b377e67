package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/netfault"
)

// A VM on the pod network behind a Service is live-migrated while the network between the
// source and target nodes' agents is cut for several seconds: the migration waits out the cut
// and completes once it heals, and the Service answers again soon after the target pod is its
// only ready endpoint, and goes on answering (the soak once saw a guest silent through its
// Service for over 5 s after such a migration).
func TestServiceAnswersAfterAMigrationTheNetworkCutSlowed(t *testing.T) {
	const (
		grace = 60
		// cutFor is how long the network between the agents is cut: long enough that TCP's
		// retransmissions back off past it, as in the soak's run that found the gap.
		cutFor = 6 * time.Second
		// afterReady is how soon after the target pod is the Service's only ready endpoint
		// the Service must answer; silence is the longest it may then be silent, and
		// watchAfter how long the client goes on asking.
		afterReady = 2 * time.Second
		silence    = 2 * time.Second
		watchAfter = 15 * time.Second
	)
	faults, err := netfault.New()
	if err != nil {
		t.Fatalf("network faults, which this test needs, need root, cgroup v2 and nftables: %v", err)
	}
	t.Cleanup(func() {
		if err := faults.Close(); err != nil {
			t.Errorf("removing the network faults' table and groups: %v", err)
		}
	})
	served := startServedVM(t, grace, func(n *testNode) {
		if err := faults.Join(n.Name(), n.agent.Pid()); err != nil {
			t.Fatalf("putting node %s's agent in its network group: %v", n.Name(), err)
		}
	})
	network, nodes, kubeProxy, ns, vmi, address, source := served.network, served.nodes, served.kubeProxy, served.ns, served.vmi, served.address, served.source
	sourcePod := launcherPod(t, vmi)
	boot, _ := waitGuestAnswer(t, network, net.JoinHostPort(sourcePod.Status.PodIP, fmt.Sprint(protocol.ServePort)), bootTimeout)
	waitGuestAnswer(t, network, address, bootTimeout)
	t.Logf("the guest answers through the Service %s: boot %s", address, boot)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	switches := watchSwitch(t, ns)
	defer switches.close()
	_, collect := askEvery(ctx, network, address)
	evicted := time.Now()
	evict(t, source, vmi)

	// The cut begins as soon as the migration's stream runs between the two agents.
	var mig v1alpha1.VirtualMachineInstanceMigration
	err = wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, grace*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, m := range list.Items {
			if m.Spec.VMIName == vmi.Name && m.Status.Phase == v1alpha1.MigrationRunning && m.Status.TargetNode != "" {
				mig = m
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no migration of %s reached phase Running: %v", vmi.Name, err)
	}
	var target *testNode
	for _, n := range nodes {
		if n.Name() == mig.Status.TargetNode {
			target = n
		}
	}
	if target == nil || target == source {
		t.Fatalf("the migration's target node %q is not the other node", mig.Status.TargetNode)
	}
	for _, way := range [][2]*testNode{{source, target}, {target, source}} {
		if err := faults.Cut(way[0].Name(), netip.MustParseAddr(way[1].Address())); err != nil {
			t.Fatalf("cutting the network from %s to %s: %v", way[0].Name(), way[1].Name(), err)
		}
	}
	cut := time.Now()
	cutDone := time.After(cutFor)
	completed := make(chan time.Time, 1)
	go func() {
		// What waitVMI sees; its failure is reported below, after the cut heals.
		_ = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, grace*time.Second, true, func(ctx context.Context) (bool, error) {
			v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, vmi.Name, metav1.GetOptions{})
			if err == nil && v.Status.NodeName == target.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed {
				completed <- time.Now()
				return true, nil
			}
			return false, nil
		})
	}()
	<-cutDone
	if err := faults.Heal(); err != nil {
		t.Fatalf("healing the network: %v", err)
	}
	healed := time.Now()
	var done time.Time
	select {
	case done = <-completed:
	case <-time.After(grace * time.Second):
		t.Fatalf("the migration of %s did not complete within %d s of the cut's healing", vmi.Name, grace)
	}
	if done.Before(cut) {
		t.Fatalf("the migration completed at %s, before the cut at %s: it did not meet the cut", done.Format(time.StampMilli), cut.Format(time.StampMilli))
	}
	moved := waitVMI(t, ns, vmi.Name, 10*time.Second, "the VM on the target node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == target.Name()
	})
	targetPod := launcherPodOn(t, moved, target.Name())
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return !switches.at(sliceReady(targetPod.Name)).IsZero(), nil
	})
	if err != nil {
		t.Fatalf("the target pod %s never became the Service's only ready endpoint", targetPod.Name)
	}
	onlyTarget := switches.at(sliceReady(targetPod.Name))
	ready := onlyTarget
	if done.After(ready) {
		ready = done
	}
	// The client goes on for a window long enough to see the silence the soak saw, 4 s after
	// settling; what it saw is judged below.
	<-time.After(time.Until(ready.Add(watchAfter)))
	stop()
	all := collect()

	var answers []*answer
	failed := 0
	for i := range all {
		a := &all[i]
		if a.err != nil {
			failed++
			continue
		}
		if a.boot != boot {
			t.Fatalf("an answer at %s came from boot %s, not %s: the guest rebooted", a.received.Format(time.StampMilli), a.boot, boot)
		}
		answers = append(answers, a)
	}
	slices.SortStableFunc(answers, func(a, b *answer) int { return a.received.Compare(b.received) })
	// The longest silence of the whole run, and the longest from ready on (counting from ready
	// itself to the first answer after it).
	var longest, longestAfter time.Duration
	var longestFrom, longestAfterFrom time.Time
	lastAt := ready
	for i, a := range answers {
		if i > 0 {
			if gap := a.received.Sub(answers[i-1].received); gap > longest {
				longest, longestFrom = gap, answers[i-1].received
			}
		}
		if a.received.After(ready) {
			if gap := a.received.Sub(lastAt); gap > longestAfter {
				longestAfter, longestAfterFrom = gap, lastAt
			}
			lastAt = a.received
		}
	}
	var firstAfterReady time.Time
	for _, a := range answers {
		if a.received.After(ready) {
			firstAfterReady = a.received
			break
		}
	}
	if end := time.Now(); end.Sub(lastAt) > longestAfter {
		longestAfter, longestAfterFrom = end.Sub(lastAt), lastAt
	}

	// The switch: the answers on either side of the guest's arrival on the target.
	var timeline string
	landed := guestArrived(t, target, targetPod)
	for i := 1; i < len(answers); i++ {
		if a, b := answers[i-1], answers[i]; a.received.Before(landed) && !b.received.Before(landed) {
			timeline = switchTimeline(t, switches, a, b, source, target, sourcePod, targetPod, kubeProxy.LogPath, vmi.Name)
		}
	}
	ms := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%+d ms", at.Sub(cut).Milliseconds())
	}
	t.Logf("from the cut: evicted %s, cut %s, healed %s, migration completed %s (took %s from the eviction), guest resumed on the target %s, the target the only ready endpoint %s, the source's forward %s, ended %s; first answer after both %s; %d requests, %d failed after a retry; longest silence %s from %s, from the target's being the only endpoint on %s from %s; the switch:\n%s",
		ms(evicted), ms(cut), ms(healed), ms(done), done.Sub(evicted).Round(time.Millisecond), ms(landed), ms(onlyTarget),
		ms(lastTime(logTimes(t, source.agent.LogPath(), podnetwork.MsgForwarding, vmi.Name))),
		ms(lastTime(logTimes(t, source.agent.LogPath(), podnetwork.MsgForwardEnded, vmi.Name))),
		ms(firstAfterReady), len(all), failed,
		longest.Round(time.Millisecond), ms(longestFrom), longestAfter.Round(time.Millisecond), ms(longestAfterFrom), timeline)
	if done.Before(healed) {
		t.Logf("the migration completed during the cut, %s before it healed", healed.Sub(done).Round(time.Millisecond))
	}
	if firstAfterReady.IsZero() || firstAfterReady.Sub(ready) > afterReady {
		t.Errorf("the Service did not answer within %s of the migration's completion with the target pod its only ready endpoint (first answer %s)", afterReady, ms(firstAfterReady))
	}
	if longestAfter > silence {
		t.Errorf("the Service was silent for %s from %s, after the migration completed and the target pod was its only ready endpoint (at most %s)", longestAfter.Round(time.Millisecond), ms(longestAfterFrom), silence)
	}
	if longest > 5*time.Second {
		t.Errorf("the Service was silent for %s from %s during the run", longest.Round(time.Millisecond), ms(longestFrom))
	}
}

// lastTime is the last of times; zero if none.
func lastTime(times []time.Time) time.Time {
	if len(times) == 0 {
		return time.Time{}
	}
	return times[len(times)-1]
}
