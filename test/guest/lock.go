package guest

import (
	"os"
	"path/filepath"

	"github.com/lifeboat-vm/lifeboat/test/internal/cache"
)

// lockCache takes the cache's exclusive lock, which serialises builders in all processes
// (test packages run in parallel). Callers check again for what they build after taking
// it, since another process may have built it while they waited.
func lockCache(dir string) (unlock func(), err error) {
	return cache.Lock(filepath.Join(dir, ".lock"))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
