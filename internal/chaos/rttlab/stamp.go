package rttlab

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// stampedReader reads a TCP connection with the kernel's receive time of
// the bytes (SO_TIMESTAMPNS): the time they reached the link, not the
// later time the reading goroutine was scheduled, which on a busy
// machine adds tens of microseconds to every chunk.
type stampedReader struct {
	c   net.Conn
	raw syscall.RawConn // nil if the connection gives no timestamps
	oob []byte
}

func newStampedReader(c net.Conn) *stampedReader {
	r := &stampedReader{c: c, oob: make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return r
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return r
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err == nil && serr == nil {
		r.raw = raw
	}
	return r
}

// read reads into b and says when the bytes arrived.
func (r *stampedReader) read(b []byte) (int, time.Time, error) {
	if r.raw == nil {
		n, err := r.c.Read(b)
		return n, time.Now(), err
	}
	var n, oobn int
	var rerr error
	err := r.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), b, r.oob, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	now := time.Now()
	switch {
	case err != nil:
		return 0, now, err
	case rerr != nil:
		return 0, now, rerr
	case n == 0:
		return 0, now, io.EOF
	}
	return n, arrival(r.oob[:oobn], now), nil
}

// arrival is the receive time in the control messages oob, or now if
// there is none. The kernel's stamp is on the realtime clock; it is
// carried onto now's monotonic reading, so that a clock step cannot move
// a due time.
func arrival(oob []byte, now time.Time) time.Time {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return now
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := *(*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			ago := now.Sub(time.Unix(ts.Unix()))
			if ago < 0 || ago > time.Second {
				return now
			}
			return now.Add(-ago)
		}
	}
	return now
}
