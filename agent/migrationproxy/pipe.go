package migrationproxy

import (
	"io"
	"net"
)

// halfCloser is a connection whose sending side can be shut on its own, as TCP and unix
// stream connections can.
type halfCloser interface {
	CloseWrite() error
}

// pipe copies a to b and b to a until both directions end. The end of one direction is
// passed on as a half-close, not a close: libvirt and QEMU may still be reading the other
// way after they finished writing, and a full close would cut that short. A direction that
// fails (not a clean end of stream) ends both, since the stream is broken then.
func pipe(a, b net.Conn) {
	errs := make(chan error, 2)
	go func() { errs <- copyHalf(b, a) }()
	go func() { errs <- copyHalf(a, b) }()
	for range 2 {
		if err := <-errs; err != nil {
			_ = a.Close()
			_ = b.Close()
		}
	}
}

// copyHalf copies src to dst and then half-closes dst, so dst's reader sees the end of the stream.
func copyHalf(dst, src net.Conn) error {
	if _, err := io.Copy(dst, src); err != nil {
		return err
	}
	if hc, ok := dst.(halfCloser); ok {
		return hc.CloseWrite()
	}
	return dst.Close()
}
