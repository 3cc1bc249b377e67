package launcher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"
)

// The guest's serial console is logged to a file in the pod's run volume, by QEMU, which never
// rotates it: a guest printing without end would fill the node's disk (issue 45, N13), and an
// evacuation would carry the flood to the next node. The launcher empties the file once it passes
// maxConsoleLog, checking every consoleLogInterval; QEMU appends to it (the domain's log has
// append on), so it writes on at the file's new end. The run volume's size limit
// (evacuation/vmi) is the backstop: a guest that outruns the check has its pod evicted.
const (
	maxConsoleLog      = 16 << 20
	consoleLogInterval = 5 * time.Second
)

// consoleLogEmptied is written where the log's emptied past began.
var consoleLogEmptied = fmt.Sprintf("\r\n[lifeboat: the console log passed %d MiB and was emptied; kubectl lifeboat console shows the console live]\r\n", maxConsoleLog>>20)

// boundConsoleLog keeps the console log at path under maxConsoleLog until ctx ends.
func boundConsoleLog(ctx context.Context, path string, log *slog.Logger) {
	t := time.NewTicker(consoleLogInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		emptied, err := trimConsoleLog(path, maxConsoleLog)
		if err != nil {
			log.Warn("bounding the console log", "err", err)
		} else if emptied {
			log.Info("the console log passed its bound and was emptied", "bound", maxConsoleLog)
		}
	}
}

// trimConsoleLog empties the log at path if it is larger than limit, and says where; a log not
// yet there is left alone.
func trimConsoleLog(path string, limit int64) (bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Size() <= limit {
		return false, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return false, err
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return false, err
	}
	if _, err := f.WriteString(consoleLogEmptied); err != nil {
		f.Close()
		return true, err
	}
	return true, f.Close()
}
