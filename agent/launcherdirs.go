package agent

import (
	"context"
	"os"
	"path/filepath"
	"time"
)

// LauncherDir is one per-VMI directory under the domains directory, as the sweep sees it.
type LauncherDir struct {
	// UID is the directory's name, its VMI's UID.
	UID string
	// Changed is the newest modification time of the directory and the files in it: a running
	// guest's console log keeps it recent.
	Changed time.Time
}

// StaleLauncherDirs picks the launcher directories to remove: a directory goes with the last
// launcher pod of its VMI on this node, as a pod's emptyDir goes with the pod. Until the pod
// is deleted its files stay (a migrated guest's source console log, a failed launcher's
// libvirt log). A directory is kept while the agent is connected to its launcher, and while
// it changed within minAge: its pod may be newer than the pod list.
func StaleLauncherDirs(dirs []LauncherDir, podVMIs map[string]bool, connected func(uid string) bool, now time.Time, minAge time.Duration) []string {
	var stale []string
	for _, d := range dirs {
		if podVMIs[d.UID] || connected(d.UID) || now.Sub(d.Changed) < minAge {
			continue
		}
		stale = append(stale, d.UID)
	}
	return stale
}

// readLauncherDirs lists the directories under root with their last change.
func readLauncherDirs(root string) ([]LauncherDir, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var dirs []LauncherDir
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		d := LauncherDir{UID: e.Name()}
		path := filepath.Join(root, e.Name())
		if info, err := os.Stat(path); err == nil {
			d.Changed = info.ModTime()
		}
		files, _ := os.ReadDir(path)
		for _, f := range files {
			if info, err := f.Info(); err == nil && info.ModTime().After(d.Changed) {
				d.Changed = info.ModTime()
			}
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// sweepLauncherDirs removes the directories of launchers whose pods are gone from this node.
// The pods are listed before the directories are read, so a directory made after the list
// is recent and kept.
func (a *Agent) sweepLauncherDirs(ctx context.Context) {
	log := a.cfg.Log.With("sweep", "launcher directories")
	pods, err := a.cfg.LauncherPods(ctx)
	if err != nil {
		log.Warn("listing this node's launcher pods", "err", err)
		return
	}
	dirs, err := readLauncherDirs(a.cfg.DomainsDir)
	if err != nil {
		log.Warn("reading the domains directory", "err", err)
		return
	}
	for _, uid := range StaleLauncherDirs(dirs, pods, a.connected, a.cfg.Now(), a.cfg.LauncherDirMinAge) {
		if err := os.RemoveAll(filepath.Join(a.cfg.DomainsDir, uid)); err != nil {
			log.Warn("removing a launcher directory whose pods are gone", "vmiUID", uid, "err", err)
			continue
		}
		a.cfg.Metrics.LauncherDirsRemoved.Inc()
		log.Info("removed a launcher directory: its VMI has no launcher pod on this node any more", "vmiUID", uid)
	}
}
