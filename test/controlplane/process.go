package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Process is a component of a test cluster: a child that dies with its parent and
// logs to a file in the control plane's directory.
type Process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// StartProcess starts path with args in dir, logging to dir/<name>.log and recording its pid in
// dir/pids, so that a sweep can end it if the test binary dies first.
func StartProcess(dir, name, path string, args ...string) (*Process, error) {
	return StartProcessWithEnv(dir, name, nil, path, args...)
}

// StartProcessWithEnv is StartProcess with env added to the test binary's environment (a later
// entry wins over an earlier one of the same name).
func StartProcessWithEnv(dir, name string, env []string, path string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	// Appended to: a component started again (a restarted kubelet, a killed agent) keeps the
	// log of its earlier runs before the new one.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = dir
	// Pdeathsig: a test binary killed by its timeout must not leave a control plane behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	if err := appendPID(dir, cmd.Process.Pid); err != nil {
		return p, err
	}
	return p, nil
}

// Exited tells whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop asks the component to exit and kills it if it has not within the timeout.
func (p *Process) Stop(timeout time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Kill ends the process at once, as a crash would, and waits until it has.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Pid is the process's pid.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// LogPath is the file the process logs to.
func (p *Process) LogPath() string { return p.logPath }

// LogTail is the end of the component's log, for error messages.
func (p *Process) LogTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	const max = 3000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(bytes.TrimSpace(b))
}

// ExitError says that the process exited, how, and what its log ended with.
func (p *Process) ExitError() error {
	return fmt.Errorf("%s exited (%v); the end of %s:\n%s", p.name, p.err, p.logPath, p.LogTail())
}

const pidsFile = "pids"

func appendPID(dir string, pid int) error {
	f, err := os.OpenFile(filepath.Join(dir, pidsFile), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, pid)
	return err
}

// sweepStale removes what a control plane whose owner died (a test binary killed by its
// timeout, say) left in the temporary directory: any component still alive, and its files.
func sweepStale(parent string) error {
	dirs, err := filepath.Glob(filepath.Join(parent, dirPattern))
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		owner, err := readPID(filepath.Join(d, ownerFile))
		if err != nil || alive(owner) {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, pidsFile)); err == nil {
			for _, f := range bytes.Fields(b) {
				if pid, err := strconv.Atoi(string(f)); err == nil && alive(pid) && ownedBy(pid, d) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(bytes.TrimSpace(b)))
}

func alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// ownedBy guards against a recycled pid: the process must still run in the stale directory.
func ownedBy(pid int, dir string) bool {
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	return err == nil && cwd == dir
}
