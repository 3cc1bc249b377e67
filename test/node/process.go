package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// process is a started container: its shim, PID 1 of the container's PID namespace. Signals
// sent to it reach the container's command; SIGKILL ends every process of the container.
type process struct {
	// spec is what the container's command runs with; exec runs other commands with it too.
	spec shimSpec
	cmd  *exec.Cmd
	done chan struct{}
	// exitCode is valid once done is closed: the command's exit code, or 128+signal.
	exitCode int32
}

// startProcess starts a shim for spec with its output appended to logPath, and returns once
// the command has started, or with what kept it from starting.
func startProcess(spec shimSpec, logPath string) (*process, error) {
	encoded, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encoding the container spec: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("creating the log directory: %w", err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the container log: %w", err)
	}
	defer logFile.Close()
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the shim's report pipe: %w", err)
	}
	defer reportR.Close()

	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{shimEnv + "=" + string(encoded)}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{reportW} // becomes reportFD
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		// A node whose process dies takes its containers along: the kernel kills a PID
		// namespace with its init.
		Pdeathsig: syscall.SIGKILL,
	}
	err = cmd.Start()
	reportW.Close()
	if err != nil {
		return nil, fmt.Errorf("starting the container shim: %w", err)
	}
	p := &process{spec: spec, cmd: cmd, done: make(chan struct{})}
	go p.wait()

	// The shim closes the pipe once it has reported, and so does its exit.
	report, err := io.ReadAll(reportR)
	if err == nil && string(report) == shimStarted {
		return p, nil
	}
	<-p.done
	if len(report) == 0 {
		return nil, fmt.Errorf("the container shim exited with code %d before starting the command", p.exitCode)
	}
	return nil, errors.New(string(report))
}

func (p *process) wait() {
	// A non-zero exit is an error to Wait; the wait status says all there is to know.
	_ = p.cmd.Wait()
	p.exitCode = exitCode(p.cmd.ProcessState)
	close(p.done)
}

func exitCode(state *os.ProcessState) int32 {
	if state == nil {
		return shimFailed
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(state.ExitCode())
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// signal sends sig to the container's command (the shim forwards it); SIGKILL kills the shim
// and with it the whole container. A process that has already exited is no error.
func (p *process) signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
}
