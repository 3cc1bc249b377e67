package node

import (
	"context"
	"sync"
)

// freezer holds the node's kubelet still while the node is frozen (Freeze), as SIGSTOP holds a
// real kubelet: no heartbeats, no pod syncs. Watches still fill the caches, as a stopped
// process's sockets still receive; what they bring is acted on once the node thaws.
type freezer struct {
	mu sync.Mutex
	// frozen is closed while the node is frozen; thawed while it is not.
	frozen, thawed chan struct{}
}

func newFreezer() *freezer {
	f := &freezer{frozen: make(chan struct{}), thawed: make(chan struct{})}
	close(f.thawed)
	return f
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.frozen:
		return
	default:
	}
	close(f.frozen)
	f.thawed = make(chan struct{})
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.thawed:
		return
	default:
	}
	close(f.thawed)
	f.frozen = make(chan struct{})
}

// waitThawed returns once the node is not frozen, or ctx ended.
func (f *freezer) waitThawed(ctx context.Context) {
	f.mu.Lock()
	thawed := f.thawed
	f.mu.Unlock()
	select {
	case <-thawed:
	case <-ctx.Done():
	}
}

// whileThawed returns a context that ends when ctx does or the node freezes.
func (f *freezer) whileThawed(ctx context.Context) (context.Context, context.CancelFunc) {
	f.mu.Lock()
	frozen := f.frozen
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-frozen:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Freeze holds the node's kubelet as SIGSTOP would hold a real one: it renews no Lease, posts no
// status, syncs no pod and answers no request to its API until Thaw, so the node lifecycle controller finds it NotReady after
// its grace period. The processes of its pods are not touched: a test stops those itself
// (ContainerPIDs), and its agent.
func (n *Node) Freeze() {
	n.freezer.freeze()
	n.cfg.Logger.Info("Node frozen")
}

// Thaw lets a frozen node's kubelet go on where it stopped.
func (n *Node) Thaw() {
	n.freezer.thaw()
	n.cfg.Logger.Info("Node thawed")
}

// ContainerPIDs are the host pids of the inits (shims) of the containers the node runs; the
// containers' processes are their descendants.
func (n *Node) ContainerPIDs() []int {
	r := n.pods.runtime
	r.liveMu.Lock()
	defer r.liveMu.Unlock()
	var pids []int
	for p := range r.live {
		if p.cmd.Process != nil {
			pids = append(pids, p.cmd.Process.Pid)
		}
	}
	return pids
}
