package agent

import "testing"

func TestALaunchersReportsAreAllReadWhenNoConnectionIsOpen(t *testing.T) {
	steps := []struct {
		do   func(n *notifyConns)
		what string
		want bool
	}{
		{func(*notifyConns) {}, "never connected: a report may still come", false},
		{func(n *notifyConns) { n.opened("u") }, "connected", false},
		{func(n *notifyConns) { n.opened("u") }, "reconnecting: two connections for a moment", false},
		{func(n *notifyConns) { n.ended("u") }, "the old connection ended, the new one is open", false},
		{func(n *notifyConns) { n.ended("u") }, "the last connection ended (the launcher was killed)", true},
		{func(n *notifyConns) { n.opened("u") }, "a new connection after an end", false},
		{func(n *notifyConns) { n.ended("u") }, "ended again", true},
		{func(n *notifyConns) { n.forget("u") }, "the launcher's directory went: forgotten", false},
	}
	n := newNotifyConns()
	for _, s := range steps {
		s.do(n)
		if got := n.allRead("u"); got != s.want {
			t.Errorf("%s: all read = %v, want %v", s.what, got, s.want)
		}
	}
	if n.allRead("other") {
		t.Error("another VMI's launcher, never connected: all read, want not")
	}
}
