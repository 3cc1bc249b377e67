package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// ConsoleEscape is the byte that ends a console session typed at a terminal: Ctrl+], as virsh
// and virtctl have it.
const ConsoleEscape = 0x1d

// ErrConsoleBusy is returned when another session holds the VM's serial console.
var ErrConsoleBusy = errors.New("another console session is open on this VM: only one at a time")

// Console connects in and out to the serial console of the guest that runs in this pod, whose
// launcher directory is runDir, until in ends, in carries ConsoleEscape, or the guest's QEMU
// closes the console. It is what `kubectl lifeboat console` runs in the launcher pod. QEMU
// serves one client and would leave a second waiting silently, so a lock file turns a second
// session into ErrConsoleBusy. A terminal on in is put in raw mode, so that keys reach the
// guest as typed.
func Console(runDir string, in *os.File, out io.Writer) error {
	lock, err := os.OpenFile(filepath.Join(runDir, contract.ConsoleLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("opening the console lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return ErrConsoleBusy
	} else if err != nil {
		return fmt.Errorf("locking the console: %w", err)
	}
	socket := filepath.Join(runDir, contract.ConsoleSocket)
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("the guest's serial console is not open in this pod (%s): is the VM running here? %w", socket, err)
	}
	defer conn.Close()
	if fd := int(in.Fd()); term.IsTerminal(fd) {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		defer func() { _ = term.Restore(fd, old) }()
	}
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(out, conn)
		done <- err
	}()
	go func() { done <- copyUntilEscape(conn, in) }()
	if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// copyUntilEscape copies src to dst until src ends or carries ConsoleEscape, which is not copied.
func copyUntilEscape(dst io.Writer, src io.Reader) error {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk, escaped := buf[:n], false
			if i := bytes.IndexByte(chunk, ConsoleEscape); i >= 0 {
				chunk, escaped = chunk[:i], true
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return werr
			}
			if escaped {
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
