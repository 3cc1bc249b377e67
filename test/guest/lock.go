package guest

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// lockCache takes the cache's exclusive lock, which serialises builders in all processes
// (test packages run in parallel). Callers check again for what they build after taking
// it, since another process may have built it while they waited.
func lockCache(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the guest cache lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
