package notify

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// WriteWithFile writes m as one frame with f's descriptor beside it (SCM_RIGHTS), in one write,
// so that the descriptor arrives with the frame's first bytes.
func WriteWithFile(conn *net.UnixConn, m *Message, f *os.File) error {
	var b bytes.Buffer
	if err := Write(&b, m); err != nil {
		return err
	}
	_, _, err := conn.WriteMsgUnix(b.Bytes(), unix.UnixRights(int(f.Fd())), nil)
	return err
}

// FileReader reads a unix connection's bytes and keeps the descriptors that come with them
// (SCM_RIGHTS). At most one may wait to be taken: a peer that sends more is in error (its
// descriptors are kept, for CloseAll).
type FileReader struct {
	Conn *net.UnixConn
	fds  []*os.File
	// err is the first error about descriptors; it stays.
	err error
}

// errDescriptors is the error for a peer that sent more descriptors than one message takes.
var errDescriptors = errors.New("more than one descriptor sent")

func (r *FileReader) Read(p []byte) (int, error) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := r.Conn.ReadMsgUnix(p, oob)
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				r.fds = append(r.fds, os.NewFile(uintptr(fd), "received"))
			}
		}
		if perr != nil && err == nil {
			err = fmt.Errorf("%w: %v", ErrMalformed, perr)
		}
	}
	if r.err == nil && (flags&unix.MSG_CTRUNC != 0 || len(r.fds) > 1) {
		r.err = fmt.Errorf("%w: %w", ErrMalformed, errDescriptors)
	}
	if err == nil {
		err = r.err
	}
	return n, err
}

// Err is the first error about descriptors, which a Read that filled its buffer may not return
// (io.ReadFull drops an error that came with the bytes it wanted).
func (r *FileReader) Err() error { return r.err }

// Take returns the descriptor that came, if one did; the caller closes it.
func (r *FileReader) Take() *os.File {
	if len(r.fds) == 0 {
		return nil
	}
	f := r.fds[0]
	r.fds = r.fds[1:]
	return f
}

// Pending says whether a descriptor came that was not taken.
func (r *FileReader) Pending() bool { return len(r.fds) > 0 }

// CloseAll closes every descriptor not taken.
func (r *FileReader) CloseAll() {
	for _, f := range r.fds {
		f.Close()
	}
	r.fds = nil
}
