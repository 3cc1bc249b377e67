package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// networkSetupTimeout bounds how long the launcher waits for its node's agent to build the pod
// network: the agent may be restarting, or not serving this pod's socket yet.
const networkSetupTimeout = 2 * time.Minute

// RequestNetwork asks the agent, on the notify socket at path, to build the guest's side of
// the pod network in this process's network namespace, and returns what to offer the guest.
// It asks again (the agent builds idempotently) until it has an answer or the time is up.
func RequestNetwork(ctx context.Context, path string, ref notify.VMIRef, log *slog.Logger) (*notify.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, networkSetupTimeout)
	defer cancel()
	var lease *notify.Lease
	var last error
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		lease, last = requestNetworkOnce(ctx, path, ref)
		if last != nil {
			log.Warn("asking the agent for the pod network; trying again", "err", last)
		}
		return last == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the agent did not build the pod network within %s: %w", networkSetupTimeout, errors.Join(last, err))
	}
	return lease, nil
}

func requestNetworkOnce(ctx context.Context, path string, ref notify.VMIRef) (*notify.Lease, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if err := notify.Write(conn, &notify.Message{Kind: notify.KindHello, VMI: ref, Time: time.Now()}); err != nil {
		return nil, err
	}
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("opening the pod's network namespace: %w", err)
	}
	defer ns.Close()
	if err := notify.WriteWithFile(conn, &notify.Message{Kind: notify.KindNetworkSetup, VMI: ref, Time: time.Now()}, ns); err != nil {
		return nil, err
	}
	reply, err := notify.Read(conn)
	if err != nil {
		return nil, fmt.Errorf("reading the agent's answer: %w", err)
	}
	switch {
	case reply.Kind == notify.KindNetworkReady && reply.Lease != nil:
		return reply.Lease, nil
	case reply.Kind == notify.KindNetworkFailed:
		return nil, fmt.Errorf("the agent could not build the pod network: %s", reply.Reason)
	}
	return nil, fmt.Errorf("the agent answered %s to NetworkSetup", reply.Kind)
}
