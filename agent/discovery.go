package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// discover reports launcher sockets under root: each <root>/<vmi-uid>/libvirt-sock that exists
// now or appears later is sent to found, once per appearance. Directories that go away are sent
// to gone. It watches with fsnotify instead of polling so a new launcher is seen at once. A
// <vmi-uid> entry is the agent's link to the launcher pod's run volume (poddirs.go); the watch
// follows it.
//
// A watcher error, such as an inotify queue overflow that any launcher can provoke by churning
// files in its run volume, loses events but must not end the agent, which the node's other VMs
// need to evacuate: discover tells rescanned, rescans root (a watcher that died is made anew)
// and carries on. Only a root it cannot read or watch ends it.
func discover(ctx context.Context, root string, found, gone chan<- string, rescanned func(error)) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	known := map[string]bool{}
	for {
		err := watchLaunchers(ctx, root, known, found, gone, rescanned)
		if !errors.Is(err, errWatcherEnded) {
			return err
		}
		rescanned(err)
		// Whatever ended it may end the next one at once: not in a tight loop.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// errWatcherEnded: the watcher closed its channels by itself; another one is needed.
var errWatcherEnded = errors.New("the file watcher ended")

// watchLaunchers watches root with one watcher until ctx ends, the watcher ends, or root cannot
// be read; known are the launcher directories reported so far, kept across watchers.
func watchLaunchers(ctx context.Context, root string, known map[string]bool, found, gone chan<- string, rescanned func(error)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("creating a file watcher: %w", err)
	}
	defer w.Close()
	return watch(ctx, w, root, known, found, gone, rescanned)
}

// watch reports what w sees under root, rescanning after each error w reports.
func watch(ctx context.Context, w *fsnotify.Watcher, root string, known map[string]bool, found, gone chan<- string, rescanned func(error)) error {
	if err := scan(ctx, w, root, known, found, gone); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return errWatcherEnded
			}
			rescanned(err)
			if err := scan(ctx, w, root, known, found, gone); err != nil {
				return err
			}
		case ev, ok := <-w.Events:
			if !ok {
				return errWatcherEnded
			}
			dir, base := filepath.Dir(ev.Name), filepath.Base(ev.Name)
			switch {
			case dir == root && ev.Has(fsnotify.Create):
				if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
					known[base] = true
					watchLauncherDir(ctx, w, ev.Name, found)
				}
			case dir == root && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)):
				delete(known, base)
				send(ctx, gone, base)
			case filepath.Dir(dir) == root && base == contract.LibvirtSocket && ev.Has(fsnotify.Create):
				send(ctx, found, filepath.Base(dir))
			}
		}
	}
}

// scan (re)watches root and every launcher directory in it, reports the sockets there as found
// (the agent's connect ignores a launcher it is connected to) and the directories known before
// but gone now, whose removal a lost event would have told.
func scan(ctx context.Context, w *fsnotify.Watcher, root string, known map[string]bool, found, gone chan<- string) error {
	// Watch first, then read, so nothing created in between is missed.
	if err := w.Add(root); err != nil {
		return fmt.Errorf("watching %s: %w", root, err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var present []string
	for _, e := range entries {
		path := filepath.Join(root, e.Name())
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			present = append(present, e.Name())
			watchLauncherDir(ctx, w, path, found)
		}
	}
	for _, uid := range vanished(known, present) {
		delete(known, uid)
		send(ctx, gone, uid)
	}
	for _, uid := range present {
		known[uid] = true
	}
	return nil
}

// vanished are the known launcher directories not present any more, in order.
func vanished(known map[string]bool, present []string) []string {
	var out []string
	for _, uid := range slices.Sorted(maps.Keys(known)) {
		if !slices.Contains(present, uid) {
			out = append(out, uid)
		}
	}
	return out
}

func watchLauncherDir(ctx context.Context, w *fsnotify.Watcher, dir string, found chan<- string) {
	if err := w.Add(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return
	}
	if _, err := os.Stat(filepath.Join(dir, contract.LibvirtSocket)); err == nil {
		send(ctx, found, filepath.Base(dir))
	}
}

func send(ctx context.Context, ch chan<- string, v string) {
	select {
	case ch <- v:
	case <-ctx.Done():
	}
}
