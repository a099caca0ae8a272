package rttlab

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func newLink(t *testing.T, target string, delay time.Duration) *Link {
	t.Helper()
	l, err := NewLink(target, delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// pings returns n round trips of a one-byte ping to addr, sorted.
func pings(t *testing.T, addr string, n int) []time.Duration {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	b := []byte{1}
	var rtts []time.Duration
	for range n {
		start := time.Now()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	return rtts
}

// TestPingMeasuresConfiguredRoundTrip: what a link adds to a ping's round
// trip is twice its one-way delay, within 10%, plus at most relayCost. The
// figure compared is the fastest of many pings, through the link and
// directly, in the same run: the scheduler of a loaded machine adds to
// some pings, never takes away. The link's relay (two more hops through
// this process) costs a little on its own: 2-20 us on a quiet machine,
// 30-40 us measured under CI's parallel test load with -race.
func TestPingMeasuresConfiguredRoundTrip(t *testing.T) {
	const relayCost = 50 * time.Microsecond
	echo := echoServer(t)
	for _, oneWay := range []time.Duration{100 * time.Microsecond, 500 * time.Microsecond, 2500 * time.Microsecond} {
		t.Run(fmt.Sprint(2*oneWay), func(t *testing.T) {
			l := newLink(t, echo, oneWay)
			want := 2 * oneWay
			var added time.Duration
			for try := range 5 {
				direct := pings(t, echo, 200)
				through := pings(t, l.Addr(), 200)
				added = through[0] - direct[0]
				t.Logf("try %d: direct min %v p50 %v; through min %v p50 %v; added %v, want %v", try,
					direct[0], direct[len(direct)/2], through[0], through[len(through)/2], added, want)
				if tenth := want / 10; added >= want-tenth && added <= want+tenth+relayCost {
					return
				}
			}
			t.Fatalf("the link added %v to the round trip, want %v within 10%%, plus at most %v of relay", added, want, relayCost)
		})
	}
}

// TestOrderKept: with jitter, bytes still arrive in the order sent.
func TestOrderKept(t *testing.T) {
	l := newLink(t, echoServer(t), 200*time.Microsecond)
	l.SetDelay(200*time.Microsecond, 300*time.Microsecond)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sent bytes.Buffer
	for i := range 2000 {
		fmt.Fprintf(&sent, "%d,", i)
	}
	wrote := make(chan error, 1)
	go func() {
		// Many small writes, so that many chunks cross the link.
		b := sent.Bytes()
		for len(b) > 0 {
			n := min(len(b), 5)
			if _, err := c.Write(b[:n]); err != nil {
				wrote <- err
				return
			}
			b = b[n:]
		}
		wrote <- nil
	}()
	want := sent.Len()
	got := make([]byte, want)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent.Bytes()) {
		t.Fatalf("bytes out of order:\n%.200s\nwant\n%.200s", got, sent.Bytes())
	}
}

// TestCutAndHeal: nothing crosses a cut link; healing resets the
// connections that were open across it, and new ones work.
func TestCutAndHeal(t *testing.T) {
	l := newLink(t, echoServer(t), 100*time.Microsecond)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pingOnce(t, c)
	l.Cut()
	if _, err := c.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	b := make([]byte, 1)
	if n, err := c.Read(b); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read across a cut: %d bytes, %v", n, err)
	}
	l.Heal()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(b); err == nil {
		t.Fatal("a connection open across the cut still works after Heal")
	}
	c2, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	pingOnce(t, c2)
}

func pingOnce(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b := []byte{7}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 7 {
		t.Fatalf("ping: %v %v", b, err)
	}
	c.SetDeadline(time.Time{})
}
