package agent

import (
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
)

// guestFilterDrops serves, at each scrape, the counters of the filter in each VM's launcher pod
// that drops what its guest sends from addresses not its own (podnetwork.FilterRules). It keeps
// each pod's network namespace open from the network's set-up until the launcher's directory
// goes: the agent does not share the node's PID namespace, so this is its only way back in.
type guestFilterDrops struct {
	desc *prometheus.Desc
	read func(ns int) (spoofed, unsupported uint64, err error)

	mu    sync.Mutex
	byUID map[string]watchedFilter
}

type watchedFilter struct {
	namespace, name string
	netns           *os.File
}

func newGuestFilterDrops() *guestFilterDrops {
	return &guestFilterDrops{
		desc: prometheus.NewDesc("lifeboat_agent_guest_frames_dropped_total",
			"Frames a VM's guest sent that the filter in its launcher pod dropped, by reason: spoofed (a source MAC or IPv4 address, or an ARP sender, not the guest's) or unsupported (IPv6, VLAN-tagged, neither IPv4 nor ARP). From 0 each time the pod network is built.",
			[]string{"namespace", "vmi", "reason"}, nil),
		read:  podnetwork.DroppedFromGuest,
		byUID: map[string]watchedFilter{},
	}
}

// watch keeps a descriptor of netns, the pod network of VMI namespace/name with uid, replacing
// any it kept for the VMI before.
func (g *guestFilterDrops) watch(uid, namespace, name string, netns *os.File) error {
	f, err := dupFile(netns, "netns of "+uid)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, ok := g.byUID[uid]; ok {
		old.netns.Close()
	}
	g.byUID[uid] = watchedFilter{namespace: namespace, name: name, netns: f}
	return nil
}

// forget closes what watch kept for the VMI with uid: its pod is gone, or going.
func (g *guestFilterDrops) forget(uid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w, ok := g.byUID[uid]; ok {
		w.netns.Close()
		delete(g.byUID, uid)
	}
}

func (g *guestFilterDrops) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

// Collect reads every kept namespace's counters; the lock is held throughout so that no
// descriptor is closed, and its number reused, while it is read.
func (g *guestFilterDrops) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range g.byUID {
		spoofed, unsupported, err := g.read(int(w.netns.Fd()))
		if err != nil {
			// A pod whose network is being torn down, or built again: nothing to report this time.
			continue
		}
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.CounterValue, float64(spoofed), w.namespace, w.name, podnetwork.SpoofedCounter)
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.CounterValue, float64(unsupported), w.namespace, w.name, podnetwork.UnsupportedCounter)
	}
}
