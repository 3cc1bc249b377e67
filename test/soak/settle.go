package soak

import (
	"time"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/soak/check"
)

// Recent is how lately a guest must have counted on its console, and answered through its
// Service, to count as running.
const Recent = 5 * time.Second

// Counted is the instance whose counter last rose on a console of a VM's, and when.
type Counted struct {
	Instance string
	At       time.Time
}

// Seen is what the soak saw of its guests, each VM by namespace/name.
type Seen struct {
	VMs []string
	// Counting is, per VM, the instance whose counter rose last.
	Counting map[string]Counted
	// Answered is, per VM, when it last answered through its Service.
	Answered map[string]time.Time
}

// AllCounting says every VM's counter rose within Recent of now, on whichever instance's console.
func (s Seen) AllCounting(now time.Time) bool {
	for _, vm := range s.VMs {
		if now.Sub(s.Counting[vm].At) > Recent {
			return false
		}
	}
	return true
}

// Silent lists the VMs that have not answered through their Services within Recent of now.
func (s Seen) Silent(now time.Time) []string {
	var out []string
	for _, vm := range s.VMs {
		if now.Sub(s.Answered[vm]) > Recent {
			out = append(out, vm)
		}
	}
	return out
}

// Settled says that at now the API's last snapshot, taken after since, shows every VM that
// should run Running and nothing held, that the instance each counts on is the one the API
// shows (an instance restarted just before since still counts for a moment after the API shows
// the new one), and that every guest counts and answers. One settled look is not enough: see Calm.
func Settled(last check.Snapshot, seen Seen, since, now time.Time) bool {
	if !last.At.After(since) || len(last.Holds) > 0 {
		return false
	}
	for _, vm := range last.VMs {
		if vm.WantRunning && (vm.Phase != string(v1alpha1.VMIRunning) || seen.Counting[vm.Name].Instance != vm.Instance) {
			return false
		}
	}
	return seen.AllCounting(now) && len(seen.Silent(now)) == 0
}

// Calm says when the cluster has looked settled for long enough: a VMI being deleted still shows
// Running, and a guest that has just stopped still counts and answers for Recent, so a look may
// be settled for a moment. Window should be longer than Recent.
type Calm struct {
	Window time.Duration
	// since is when the looks began to be settled without a break; zero after one that was not.
	since time.Time
}

// Look records whether the look at now was settled, and says whether every look for Window up
// to now was.
func (c *Calm) Look(now time.Time, settled bool) bool {
	if !settled {
		c.since = time.Time{}
		return false
	}
	if c.since.IsZero() {
		c.since = now
	}
	return now.Sub(c.since) >= c.Window
}

// Since is when the looks began to be settled without a break; zero if the last was not.
func (c *Calm) Since() time.Time { return c.since }
