package agent

import "sync"

// notifyConns follows each launcher's notify connections, by VMI UID, so that a migration whose
// call failed knows when no report of the launcher's can still come: none is open and one has
// ended. A launcher killed a moment before the migration started is then known silent at once,
// not after launcherReportWait.
type notifyConns struct {
	mu     sync.Mutex
	open   map[string]int
	silent map[string]bool
}

func newNotifyConns() *notifyConns {
	return &notifyConns{open: map[string]int{}, silent: map[string]bool{}}
}

// opened records a connection's hello.
func (n *notifyConns) opened(uid string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.open[uid]++
	delete(n.silent, uid)
}

// ended records the clean end of a connection that had said hello: every message on it was read.
func (n *notifyConns) ended(uid string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.open[uid]--; n.open[uid] <= 0 {
		delete(n.open, uid)
		n.silent[uid] = true
	}
}

// allRead reports whether the launcher's reports have all been read: it had a connection, and
// none is open now.
func (n *notifyConns) allRead(uid string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.silent[uid]
}

// forget drops what is known of a launcher that is gone.
func (n *notifyConns) forget(uid string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.open, uid)
	delete(n.silent, uid)
}
