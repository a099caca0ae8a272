package chaos

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// Breaker forwards TCP connections from a loopback port to a target
// address and can break every connection it carries at once, as a
// network's timeouts break the connections a partition silenced.
//
// Put in front of etcd's fault proxy, it is what makes the proxy's
// blackhole a partition: the proxy drops the bytes it reads while
// blackholed but keeps the connection, which no TCP link does (TCP
// retransmits them, or the connection breaks). Lifting the blackholes
// alone would leave connections that silently lost bytes in the middle of
// their streams: a watch would carry on past events it never got. Closing
// the proxy instead would end the link for good. Breaking the connections
// here, while the blackholes are still on, ends them all, including idle
// ones, and no byte crosses a connection after bytes were dropped on it.
// (rttlab.Link resets its connections on Heal by itself, but cannot pause
// a connection as the proxy does.)
type Breaker struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// link is one forwarded connection: in from the client, out to the target.
type link struct{ in, out net.Conn }

// NewBreaker listens on a free loopback port and forwards each connection
// to target (host:port). It returns the Breaker and its address
// (host:port). The caller closes it.
func NewBreaker(target string) (*Breaker, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	b := &Breaker{ln: ln, target: target, conns: map[*link]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	return b, ln.Addr().String(), nil
}

func (b *Breaker) serve() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // e.g. out of descriptors
			continue
		}
		// The target is dialed and the link registered under the lock,
		// so that a Break either comes after (and breaks it) or has
		// finished, with its heal, before the target's side exists.
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			in.Close()
			return
		}
		out, err := net.DialTimeout("tcp", b.target, 5*time.Second)
		if err != nil {
			b.mu.Unlock()
			reset(in)
			continue
		}
		l := &link{in: in, out: out}
		b.conns[l] = struct{}{}
		b.wg.Add(2)
		b.mu.Unlock()
		go b.copy(l, out, in)
		go b.copy(l, in, out)
	}
}

// copy forwards one direction of l; when it ends, so does l.
func (b *Breaker) copy(l *link, dst, src net.Conn) {
	defer b.wg.Done()
	io.Copy(dst, src)
	b.mu.Lock()
	delete(b.conns, l)
	b.mu.Unlock()
	l.in.Close()
	l.out.Close()
}

// Break resets every connection carried so far, then calls heal (if not
// nil) before any new connection is forwarded: a connection the client
// opens meanwhile waits in the listener's queue until heal has returned.
func (b *Breaker) Break(heal func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l := range b.conns {
		reset(l.in)
		reset(l.out)
		delete(b.conns, l)
	}
	if heal != nil {
		heal()
	}
}

// Close stops accepting, breaks every connection and waits for the
// forwarding to end, which it does, as every connection is closed.
func (b *Breaker) Close() error {
	b.mu.Lock()
	b.closed = true
	err := b.ln.Close()
	b.mu.Unlock()
	b.Break(nil)
	b.wg.Wait()
	return err
}

// reset closes c with a TCP reset rather than an orderly close, as a
// connection that timed out ends for its peer.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// echo serves TCP connections that send back what they get, until the
// test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	conns := make(chan net.Conn, 64)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

// A partition made with the fault proxy's blackholes and healed through a
// Breaker: every connection that lived through it, idle ones too, is
// broken before the blackholes lift, new ones carry bytes again, and the
// proxy then closes at once.
func TestBreakerHealsBlackhole(t *testing.T) {
	p, url := etcdproc.ProxyT(t, "http://"+echo(t))
	b, addr, err := NewBreaker(url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	busy, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if err := roundTrip(busy, "before"); err != nil {
		t.Fatalf("before the partition: %v", err)
	}
	p.BlackholeTx()
	p.BlackholeRx()
	if err := roundTrip(busy, "during"); err == nil {
		t.Fatal("bytes crossed the blackhole")
	}
	healed := false
	b.Break(func() {
		p.UnblackholeTx()
		p.UnblackholeRx()
		healed = true
	})
	if !healed {
		t.Fatal("Break did not call heal")
	}
	for name, c := range map[string]net.Conn{"busy": busy, "idle": idle} {
		if err := roundTrip(c, "after"); err == nil {
			t.Errorf("the %s connection carried bytes after the heal", name)
		}
	}
	again, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := roundTrip(again, "after"); err != nil {
		t.Errorf("a new connection after the heal: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Breaker.Close still waiting after 5s")
	}
	go func() { p.Close(); closed <- nil }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy's Close still waiting after 5s")
	}
}
