package etcdtest

import (
	"io"
	"net"
	"testing"
	"time"
)

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
// proxy then closes at once (an idle connection's copy loops used to keep
// Close waiting for ever).
func TestBreakerHealsBlackhole(t *testing.T) {
	p, url, err := NewProxy("", "http://"+echo(t))
	if err != nil {
		t.Fatal(err)
	}
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
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy's Close still waiting after 5s")
	}
}
