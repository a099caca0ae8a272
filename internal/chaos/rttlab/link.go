package rttlab

import (
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// chunkSize is the most a reader takes from a connection at once.
const chunkSize = 64 << 10

// queueLen bounds the chunks in flight on one direction of one
// connection; a reader that fills it waits, as a full window would.
const queueLen = 4096

// Link forwards connections from a loopback port to a target, each
// direction delayed.
type Link struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	delay  time.Duration // one way
	jitter time.Duration // up to this much more, per chunk
	cut    bool
	healed chan struct{} // closed by Heal; new connections wait on it while cut
	conns  map[*pipe]struct{}
	closed bool
	wg     sync.WaitGroup
}

// pipe is one forwarded connection: in from the client, out to the target.
type pipe struct{ in, out net.Conn }

// NewLink listens on a free loopback port and forwards each connection to
// target (host:port) with delay on each direction. The caller closes it.
func NewLink(target string, delay time.Duration) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, target: target, delay: delay, conns: map[*pipe]struct{}{}, healed: make(chan struct{})}
	close(l.healed)
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// Addr is the link's own address (host:port), to dial instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// SetDelay changes the one-way delay and its jitter, from the next chunk
// on. A shorter delay never reorders: a chunk is never written before the
// one read ahead of it.
func (l *Link) SetDelay(delay, jitter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delay, l.jitter = delay, jitter
}

func (l *Link) due(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.delay
	if l.jitter > 0 {
		d += rand.N(l.jitter)
	}
	return now.Add(d)
}

// Cut partitions the link: nothing crosses it in either direction, and
// connections opened meanwhile wait unanswered, until Heal.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		l.cut = true
		l.healed = make(chan struct{})
	}
}

// Heal ends a Cut. The connections that were open across it are reset,
// as a network's timeouts end connections that a partition silenced: none
// carries on past the bytes the cut dropped.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		return
	}
	l.cut = false
	for p := range l.conns {
		p.reset()
		delete(l.conns, p)
	}
	close(l.healed)
}

func (l *Link) isCut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

// Close stops the link, resets every connection and waits for every
// goroutine it started.
func (l *Link) Close() error {
	l.mu.Lock()
	l.closed = true
	err := l.ln.Close()
	for p := range l.conns {
		p.reset()
		delete(l.conns, p)
	}
	if l.cut {
		l.cut = false
		close(l.healed)
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

func (l *Link) serve() {
	defer l.wg.Done()
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.connect(in)
	}
}

// connect dials the target for in, once the link is not cut, and starts
// forwarding both ways.
func (l *Link) connect(in net.Conn) {
	defer l.wg.Done()
	l.mu.Lock()
	healed := l.healed
	l.mu.Unlock()
	<-healed
	out, err := net.Dial("tcp", l.target)
	if err != nil {
		in.Close()
		return
	}
	p := &pipe{in: in, out: out}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		p.reset()
		return
	}
	l.conns[p] = struct{}{}
	l.mu.Unlock()
	l.wg.Add(2)
	go l.forward(p, out, in)
	go l.forward(p, in, out)
}

// chunk is bytes read, with the time they are due at the other end.
type chunk struct {
	b   []byte
	due time.Time
}

// forward copies src to dst, each chunk written at its due time, and
// resets both when either side ends.
func (l *Link) forward(p *pipe, dst, src net.Conn) {
	defer l.wg.Done()
	q := make(chan chunk, queueLen)
	done := make(chan struct{})
	go func() {
		defer close(done)
		write(dst, q, l.isCut)
	}()
	r := newStampedReader(src)
	var last time.Time
	for {
		buf := make([]byte, chunkSize)
		n, arrived, err := r.read(buf)
		if n > 0 {
			due := l.due(arrived)
			if due.Before(last) {
				due = last // order kept: never ahead of the chunk before
			}
			last = due
			q <- chunk{b: buf[:n], due: due}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	p.reset()
	l.mu.Lock()
	delete(l.conns, p)
	l.mu.Unlock()
}

// write writes each chunk of q to dst at its due time, dropping those
// that come due while the link is cut.
func write(dst net.Conn, q <-chan chunk, cut func() bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A thread's default timer slack is 50µs; the wire's precision needs 1ns.
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	var s sleeper
	for c := range q {
		s.until(c.due)
		if cut() {
			continue
		}
		if _, err := dst.Write(c.b); err != nil {
			// Ending dst ends the other direction, whose end resets src:
			// the reader stops. Until then, drain q so that it never blocks.
			dst.Close()
			for range q {
			}
			return
		}
	}
}

// sleeper sleeps until a time with microsecond precision: nanosleep short
// of it by how late such sleeps have been waking, then a spin.
type sleeper struct{ late time.Duration }

// maxLate bounds the lateness a sleeper allows for: beyond it the machine
// is overloaded, and spinning longer would only make that worse.
const maxLate = 200 * time.Microsecond

func (s *sleeper) until(t time.Time) {
	if d := time.Until(t) - s.late; d > 0 {
		ts := unix.NsecToTimespec(d.Nanoseconds())
		start := time.Now()
		for errors.Is(unix.Nanosleep(&ts, &ts), unix.EINTR) {
		}
		over := time.Since(start) - d
		// An average over the last few sleeps, by halves.
		s.late = min(maxLate, max(0, (s.late+over)/2+time.Microsecond))
	}
	for time.Now().Before(t) {
	}
}

// reset closes both sides with a TCP reset.
func (p *pipe) reset() {
	for _, c := range []net.Conn{p.in, p.out} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}
