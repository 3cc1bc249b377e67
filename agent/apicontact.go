package agent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// An agent cut off from the API server (its node's network failed, or the node froze) knows
// only what it last read. It pauses nothing and kills nothing on that: its guests run on, as
// they would without lifeboat, and the cluster's side waits for the node to be declared off
// (evacuation/vmi DecideNodeLoss). Once it reaches the API server again it says how long it was
// cut off, and checks every guest on its node against its VMI, read live: a guest whose VM was
// restarted elsewhere meanwhile is destroyed (syncStray).

// ContactChange is what one look at the API server changed.
type ContactChange int

const (
	// ContactSame: nothing to report.
	ContactSame ContactChange = iota
	// ContactLost: the agent has not reached the API server for longer than the limit.
	ContactLost
	// ContactBack: the agent reached the API server after being cut off (or after not running,
	// its node frozen or suspended) for longer than the limit.
	ContactBack
)

// Contact follows the agent's contact with the API server from its periodic probes.
type Contact struct {
	// LostAfter is how long without contact counts as cut off.
	LostAfter time.Duration
	// lastOK is when a probe last reached the API server; lastProbe when one last ran.
	lastOK, lastProbe time.Time
	lost              bool
	// Outage is the last outage, set with ContactBack.
	Outage Outage
}

// Outage is a time the agent was cut off.
type Outage struct {
	From, To time.Time
	// Stopped: the agent itself did not run for longer than the limit (its probes stopped),
	// as when its node was frozen or suspended.
	Stopped bool
}

// NewContact starts following contact at now, taken as contact.
func NewContact(lostAfter time.Duration, now time.Time) *Contact {
	return &Contact{LostAfter: lostAfter, lastOK: now, lastProbe: now}
}

// Probed records a probe at now that reached the API server (ok) or not. It is pure but for c.
func (c *Contact) Probed(now time.Time, ok bool) ContactChange {
	stopped := now.Sub(c.lastProbe) > c.LostAfter
	stoppedAt := c.lastProbe
	c.lastProbe = now
	if !ok {
		if stopped && !c.lost {
			// The agent did not run, then found no API server: cut off since then at least.
			c.lastOK = stoppedAt
		}
		if !c.lost && now.Sub(c.lastOK) > c.LostAfter {
			c.lost = true
			return ContactLost
		}
		return ContactSame
	}
	switch {
	case c.lost:
		c.Outage = Outage{From: c.lastOK, To: now}
	case stopped:
		c.Outage = Outage{From: stoppedAt, To: now, Stopped: true}
	default:
		c.lastOK = now
		return ContactSame
	}
	c.lost = false
	c.lastOK = now
	return ContactBack
}

// Lost reports whether the agent counts itself cut off.
func (c *Contact) Lost() bool { return c.lost }

// Message says what happened during the outage, for the Event on the node and the log.
func (o Outage) Message(node string, guests int) string {
	what := "could not reach the API server"
	if o.Stopped {
		what = "did not run (its node was frozen or suspended)"
	}
	return fmt.Sprintf("the lifeboat agent on node %s %s from %s to %s (%s); meanwhile it paused nothing and killed nothing. "+
		"It now checks the %d guest(s) it has on the node against their VMIs: one whose VM was restarted elsewhere meanwhile is destroyed (Event %s)",
		node, what, o.From.UTC().Format(time.RFC3339), o.To.UTC().Format(time.RFC3339), o.To.Sub(o.From).Round(time.Second), guests, ReasonStrayGuestDestroyed)
}

// ReasonAPIServerContactRestored is the Event on the agent's Node once an outage ended (none
// can be written while it lasts).
const ReasonAPIServerContactRestored = "APIServerContactRestored"

// probeAPIServer reads the cluster's LifeboatConfig, live: any answer of the API server, not
// found included, is contact.
func (a *Agent) probeAPIServer(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, a.probeInterval())
	defer cancel()
	_, err := a.lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
	return err == nil || apierrors.IsNotFound(err) || apierrors.IsForbidden(err)
}

// probeInterval is how often the agent probes: a sixth of APILostAfter, within 1 to 10 s.
func (a *Agent) probeInterval() time.Duration {
	return min(max(a.cfg.APILostAfter/6, time.Second), 10*time.Second)
}

// runContact probes the API server until ctx ends, reports an outage longer than APILostAfter
// when it ends, and then has every launcher on the node checked against its VMI.
func (a *Agent) runContact(ctx context.Context) {
	c := NewContact(a.cfg.APILostAfter, a.cfg.Now())
	ticker := time.NewTicker(a.probeInterval())
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		ok := a.probeAPIServer(ctx)
		if ctx.Err() != nil {
			return
		}
		switch c.Probed(a.cfg.Now(), ok) {
		case ContactLost:
			a.cfg.Metrics.APIServerCutOff.Set(1)
			a.cfg.Log.Warn("the agent has not reached the API server for longer than --api-server-lost-after; it pauses nothing and kills nothing until it does",
				"since", c.lastOK, "lostAfter", a.cfg.APILostAfter)
		case ContactBack:
			a.cfg.Metrics.APIServerCutOff.Set(0)
			a.cfg.Metrics.APIServerOutages.Inc()
			uids := a.launcherUIDs()
			msg := c.Outage.Message(a.cfg.NodeName, len(uids))
			a.cfg.Log.Warn(msg, "from", c.Outage.From, "to", c.Outage.To, "stopped", c.Outage.Stopped)
			a.cfg.Recorder.Event(a.nodeRef(), corev1.EventTypeWarning, ReasonAPIServerContactRestored, msg)
			for _, uid := range uids {
				a.queue.Add(uid)
			}
		}
	}
}

// launcherUIDs are the VMI UIDs of the launchers the agent is connected to.
func (a *Agent) launcherUIDs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var uids []string
	for uid, l := range a.launchers {
		if l.conn != nil {
			uids = append(uids, uid)
		}
	}
	return uids
}

// nodeRef is the agent's Node, for Events, named as the kubelet names it.
func (a *Agent) nodeRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: a.cfg.NodeName, UID: types.UID(a.cfg.NodeName)}
}
