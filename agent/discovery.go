package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fsnotify/fsnotify"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// discover reports launcher sockets under root: each <root>/<vmi-uid>/libvirt-sock that exists
// now or appears later is sent to found, once per appearance. Directories that go away are sent
// to gone. It watches with fsnotify instead of polling so a new launcher is seen at once. A
// <vmi-uid> entry is the agent's link to the launcher pod's run volume (poddirs.go); the watch
// follows it.
func discover(ctx context.Context, root string, found, gone chan<- string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("creating a file watcher: %w", err)
	}
	defer w.Close()
	if err := w.Add(root); err != nil {
		return fmt.Errorf("watching %s: %w", root, err)
	}
	// Watch first, then scan, so nothing created in between is missed.
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range entries {
		path := filepath.Join(root, e.Name())
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			watchLauncherDir(ctx, w, path, found)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.Errors:
			return fmt.Errorf("watching %s: %w", root, err)
		case ev := <-w.Events:
			dir, base := filepath.Dir(ev.Name), filepath.Base(ev.Name)
			switch {
			case dir == root && ev.Has(fsnotify.Create):
				if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
					watchLauncherDir(ctx, w, ev.Name, found)
				}
			case dir == root && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)):
				send(ctx, gone, base)
			case filepath.Dir(dir) == root && base == contract.LibvirtSocket && ev.Has(fsnotify.Create):
				send(ctx, found, filepath.Base(dir))
			}
		}
	}
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
