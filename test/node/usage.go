package node

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// workingSet approximates the working set of the container whose shim is shimPID, where the
// kubelet would read its cgroup: the resident memory of every process in the container's PID
// namespace but the shim, which a real container does not have.
func workingSet(shimPID int) (int64, error) {
	namespace, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", shimPID))
	if err != nil {
		return 0, fmt.Errorf("reading the container's PID namespace: %w", err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("listing processes: %w", err)
	}
	var total int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == shimPID {
			continue
		}
		// Processes come and go while we look; one that is gone uses nothing.
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || ns != namespace {
			continue
		}
		statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
		if err != nil {
			continue
		}
		if fields := bytes.Fields(statm); len(fields) > 1 {
			if pages, err := strconv.ParseInt(string(fields[1]), 10, 64); err == nil {
				total += pages * int64(os.Getpagesize())
			}
		}
	}
	return total, nil
}
