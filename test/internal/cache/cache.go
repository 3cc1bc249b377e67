// Package cache is where the test harness keeps what it builds once (Kubernetes binaries, the
// test guest), and the lock that makes concurrent test packages build each thing once.
package cache

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Dir is $LIFEBOAT_CACHE, else <user cache directory>/lifeboat.
func Dir() (string, error) {
	if d := os.Getenv("LIFEBOAT_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a cache directory (set LIFEBOAT_CACHE): %w", err)
	}
	return filepath.Join(d, "lifeboat"), nil
}

// Lock takes an exclusive lock on the file at path, across processes, waiting for it.
func Lock(path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the lock %s: %w", path, err)
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
