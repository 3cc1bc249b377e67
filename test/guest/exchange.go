package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// Exchange runs console, an interactive console command such as kubectl lifeboat console,
// types line to the guest, and waits up to timeout for the guest's answer to it; then it
// closes console's stdin, which ends a session, and waits up to timeout for console to exit
// with success. The error says what was expected, and what console wrote on stderr.
func Exchange(console *exec.Cmd, line string, timeout time.Duration) error {
	stdin, err := console.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := console.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	console.Stderr = &stderr
	if err := console.Start(); err != nil {
		return err
	}
	heard := make(chan string, 1)
	go func() {
		defer close(heard)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			// A guest's console may put terminal output before the answer on its line.
			if i := strings.Index(lines.Text(), protocol.HeardPrefix); i >= 0 {
				heard <- strings.TrimRight(lines.Text()[i:], "\r")
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	ended := make(chan error, 1)
	var errs []error
	if _, err := io.WriteString(stdin, line+"\n"); err != nil {
		errs = append(errs, fmt.Errorf("typing into %s: %w", console.Args, err))
	}
	want := protocol.Heard(line)
	select {
	case got, ok := <-heard:
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s ended before the guest answered %q", console.Args, line))
		case got != want:
			errs = append(errs, fmt.Errorf("the guest answered %q through %s, want %q", got, console.Args, want))
		}
	case <-time.After(timeout):
		errs = append(errs, fmt.Errorf("the guest did not answer %q through %s within %s", line, console.Args, timeout))
	}
	stdin.Close()
	go func() { ended <- console.Wait() }()
	select {
	case err := <-ended:
		if err != nil {
			errs = append(errs, fmt.Errorf("%s ended with %w when its stdin closed, want success", console.Args, err))
		}
	case <-time.After(timeout):
		_ = console.Process.Kill()
		<-ended
		errs = append(errs, fmt.Errorf("%s did not end within %s of its stdin closing", console.Args, timeout))
	}
	if len(errs) > 0 {
		errs = append(errs, fmt.Errorf("its stderr:\n%s", stderr.String()))
	}
	return errors.Join(errs...)
}
