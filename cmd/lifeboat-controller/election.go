package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// signerLease is the Lease the replicas of the signer run alone (--run=signer) elect their leader on.
const signerLease = "lifeboat-signer"

// election is leader election on a Lease, so that of several replicas only one runs the
// controllers while all of them serve the webhook.
type election struct {
	enabled                                   bool
	namespace, name, identity                 string
	leaseDuration, renewDeadline, retryPeriod time.Duration
}

func (e *election) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&e.enabled, "leader-elect", false, "run the controllers only while holding the Lease --leader-election-namespace/lifeboat-controller, or with --run=signer the signer only while holding lifeboat-signer (for more than one replica)")
	fs.StringVar(&e.namespace, "leader-election-namespace", "lifeboat-system", "namespace of the leader-election Lease")
	fs.StringVar(&e.identity, "leader-election-identity", "", "this replica's name in the Lease; empty means the host name and a random suffix")
	fs.DurationVar(&e.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long others wait after the leader's last renewal before taking over")
	fs.DurationVar(&e.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up leading")
	fs.DurationVar(&e.retryPeriod, "leader-election-retry-period", 2*time.Second, "how often replicas try to acquire or renew the Lease")
	e.name = "lifeboat-controller"
}

// id is this replica's identity in the Lease: --leader-election-identity, or the host name and a
// random suffix, chosen once.
func (e *election) id() (string, error) {
	if e.identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return "", err
		}
		e.identity = host + "_" + uuid.NewString()
	}
	return e.identity, nil
}

// run calls lead while this replica leads, or at once without election. It returns when ctx
// ends or lead fails, and with an error when the lease was lost: the process should then exit,
// and be restarted as a follower, rather than guess whether another replica already leads.
func (e *election) run(ctx context.Context, kube kubernetes.Interface, log *slog.Logger, lead func(context.Context) error) error {
	if !e.enabled {
		return lead(ctx)
	}
	identity, err := e.id()
	if err != nil {
		return err
	}
	log = log.With("lease", e.namespace+"/"+e.name, "identity", identity)
	// The election outlives ctx until the controllers have stopped: the lease is released only
	// then, so that the next leader never overlaps with this one's last syncs.
	electionCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	var leading atomic.Bool
	defer context.AfterFunc(ctx, func() {
		if !leading.Load() {
			stopElection()
		}
	})()
	result := make(chan error, 1)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.namespace, Name: e.name},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		},
		LeaseDuration:   e.leaseDuration,
		RenewDeadline:   e.renewDeadline,
		RetryPeriod:     e.retryPeriod,
		ReleaseOnCancel: true,
		Name:            e.name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadingCtx context.Context) {
				leading.Store(true)
				log.Info("started leading: running the controllers")
				workCtx, stop := context.WithCancel(leadingCtx)
				stopOnCancel := context.AfterFunc(ctx, stop)
				result <- lead(workCtx)
				stopOnCancel()
				stop()
				stopElection()
			},
			OnStoppedLeading: func() { log.Info("not leading") },
			OnNewLeader:      func(leader string) { log.Info("leader elected", "leader", leader) },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	elector.Run(electionCtx)
	if leading.Load() {
		err = <-result
	}
	if err == nil && ctx.Err() == nil {
		err = fmt.Errorf("lost the lease %s/%s", e.namespace, e.name)
	}
	return err
}
