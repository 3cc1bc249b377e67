// Package reap is what a process standing in for a pod's init does for the processes under it:
// it waits for every child, orphans re-parented to it included, so that none stays a zombie.
package reap

import (
	"errors"
	"fmt"
	"syscall"
)

// Until reaps children until main exits and returns main's exit code, 128+signal where a signal
// ended it, as container runtimes report it.
func Until(main int) (int, error) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("waiting for process %d: %w", main, err)
		}
		if pid != main {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ws.ExitStatus(), nil
	}
}
