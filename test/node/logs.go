package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// logPollInterval is how often a followed log is read again for what the container wrote since.
const logPollInterval = 100 * time.Millisecond

// ContainerLog returns what the latest run of a container of pod wrote to its stdout and
// stderr, as `kubectl logs` shows it. It still works after the pod is gone.
func (n *Node) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	dir := n.layout.logDir(pod.Namespace, pod.Name, pod.UID, container)
	runs, err := logRuns(dir)
	if err != nil {
		return "", fmt.Errorf("listing the logs of container %s of pod %s: %w", container, klog.KObj(pod), err)
	}
	if len(runs) == 0 {
		return "", fmt.Errorf("container %s of pod %s has no log in %s", container, klog.KObj(pod), dir)
	}
	b, err := os.ReadFile(n.layout.logPath(pod.Namespace, pod.Name, pod.UID, container, runs[len(runs)-1]))
	if err != nil {
		return "", fmt.Errorf("reading the log of container %s of pod %s: %w", container, klog.KObj(pod), err)
	}
	return string(b), nil
}

// logRuns are the runs (restart counts) of a container that have a log in dir, oldest first.
func logRuns(dir string) ([]int32, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var runs []int32
	for _, e := range entries {
		if run, err := strconv.ParseInt(strings.TrimSuffix(e.Name(), ".log"), 10, 32); err == nil && strings.HasSuffix(e.Name(), ".log") {
			runs = append(runs, int32(run))
		}
	}
	slices.Sort(runs)
	return runs, nil
}

// logOptions are the PodLogOptions of a containerLogs request the node can honour.
type logOptions struct {
	follow, previous bool
	tailLines        *int64
	limitBytes       *int64
}

// parseLogOptions reads the query of a containerLogs request as the kubelet does (PodLogOptions,
// "tail" as an old spelling of tailLines). The node's logs are the containers' raw output,
// without the time of each line: options that need it are refused, and so is a stream of its
// own, since stdout and stderr share the file.
func parseLogOptions(q url.Values) (logOptions, error) {
	var o logOptions
	var err error
	boolean := func(name string) bool {
		v := q.Get(name)
		if v == "" || err != nil {
			return false
		}
		b, perr := strconv.ParseBool(v)
		if perr != nil {
			err = badRequest("%s=%q is not a boolean", name, v)
		}
		return b
	}
	integer := func(name string) *int64 {
		v := q.Get(name)
		if v == "" || err != nil {
			return nil
		}
		i, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || i < 0 {
			err = badRequest("%s=%q is not a number of at least 0", name, v)
			return nil
		}
		return &i
	}
	if tail := q.Get("tail"); tail != "" {
		q = maps.Clone(q)
		q.Del("tail")
		if tail != "all" {
			q.Set("tailLines", tail)
		}
	}
	o.follow, o.previous = boolean("follow"), boolean("previous")
	timestamps := boolean("timestamps")
	o.tailLines, o.limitBytes = integer("tailLines"), integer("limitBytes")
	sinceSeconds := integer("sinceSeconds")
	if err != nil {
		return o, err
	}
	if o.limitBytes != nil && *o.limitBytes == 0 {
		return o, badRequest("limitBytes must be greater than 0")
	}
	if timestamps || sinceSeconds != nil || q.Get("sinceTime") != "" {
		return o, badRequest("the emulated node keeps no time for the lines of a container's log: timestamps, sinceSeconds and sinceTime are not supported")
	}
	if s := q.Get("stream"); s != "" && s != string(corev1.LogStreamAll) {
		return o, badRequest("unable to return the given log stream: %q: the emulated node keeps a container's stdout and stderr together", s)
	}
	return o, nil
}

// containerLogs serves GET /containerLogs/{namespace}/{pod}/{container}: the log of the
// container's latest run (previous: the run before), from the first of its last tailLines lines,
// and with follow, what it writes next until it exits.
func (a *kubeletAPI) containerLogs(w http.ResponseWriter, r *http.Request) {
	opts, err := parseLogOptions(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	pod, c, err := a.podContainer(r)
	if err != nil {
		writeError(w, err)
		return
	}
	runs, err := logRuns(a.layout.logDir(pod.Namespace, pod.Name, pod.UID, c.Name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		writeError(w, err)
		return
	}
	proc, running := a.runtime.running(pod, c.Name)
	var run int32
	switch {
	case len(runs) == 0:
		writeError(w, badRequest("container %q in pod %q is waiting to start: ContainerCreating", c.Name, pod.Name))
		return
	case opts.previous && len(runs) < 2:
		writeError(w, badRequest("previous terminated container %q in pod %q not found", c.Name, pod.Name))
		return
	case opts.previous:
		run = runs[len(runs)-2]
	default:
		run = runs[len(runs)-1]
	}
	var done <-chan struct{}
	if opts.follow && !opts.previous && proc != nil && running == run {
		done = proc.done
	}
	f, err := os.Open(a.layout.logPath(pod.Namespace, pod.Name, pod.UID, c.Name, run))
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	if opts.tailLines != nil {
		offset, err := tailOffset(f, *opts.tailLines)
		if err == nil {
			_, err = f.Seek(offset, io.SeekStart)
		}
		if err != nil {
			writeError(w, err)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	if err := copyLog(r.Context(), w, f, opts.limitBytes, done); err != nil {
		a.logger.V(4).Info("Streaming a container log ended early", "pod", klog.KObj(pod), "container", c.Name, "err", err)
	}
}

// copyLog writes f to w from its current offset, at most limit bytes if limit is set, flushing
// as it goes. With done, it waits for more until done is closed and then writes the rest.
func copyLog(ctx context.Context, w http.ResponseWriter, f *os.File, limit *int64, done <-chan struct{}) error {
	out := io.Writer(w)
	var limited *limitWriter
	if limit != nil {
		limited = &limitWriter{w: w, left: *limit}
		out = limited
	}
	flush := http.NewResponseController(w).Flush
	for {
		// Once done is closed, one more copy takes everything the run wrote.
		ended := done == nil
		if !ended {
			select {
			case <-done:
				ended = true
			default:
			}
		}
		_, err := io.Copy(out, f)
		if errors.Is(err, errLimitReached) {
			return flush()
		}
		if err != nil {
			return err
		}
		if err := flush(); err != nil {
			return err
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
		case <-time.After(logPollInterval):
		}
	}
}

var errLimitReached = errors.New("limitBytes reached")

// limitWriter passes on the first left bytes, then errLimitReached.
type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errLimitReached
	}
	cut := int64(len(p)) > l.left
	if cut {
		p = p[:l.left]
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	if err == nil && cut {
		err = errLimitReached
	}
	return n, err
}

// tailOffset is where the last lines lines of f begin; a last line without its newline counts.
func tailOffset(f *os.File, lines int64) (int64, error) {
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := info.Size()
	if lines == 0 || end == 0 {
		return end, nil
	}
	buf := make([]byte, 32<<10)
	// The newline that ends the file ends its last line: the scan starts before it.
	if _, err := f.ReadAt(buf[:1], end-1); err != nil {
		return 0, err
	}
	pos := end
	if buf[0] == '\n' {
		pos--
	}
	var found int64
	for pos > 0 {
		n := min(int64(len(buf)), pos)
		pos -= n
		if _, err := f.ReadAt(buf[:n], pos); err != nil {
			return 0, err
		}
		for i := n - 1; i >= 0; i-- {
			if buf[i] == '\n' {
				if found++; found == lines {
					return pos + i + 1, nil
				}
			}
		}
	}
	return 0, nil
}
