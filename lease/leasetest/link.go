package leasetest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"
)

// Link is the network between one client and the server: etcd's fault
// proxy, on loopback, through which that client alone reaches the server.
// Its methods are safe for concurrent use; each fault lasts until undone.
type Link struct {
	p   proxy.Server
	tb  testing.TB
	cli *clientv3.Client

	mu    sync.Mutex
	conns []net.Conn // the client's connections to the proxy
}

// FaultyClient opens a client that reaches the server only through a Link
// of its own. Both are closed when the test ends.
func (s *Server) FaultyClient(t testing.TB) (*clientv3.Client, *Link) {
	t.Helper()
	p, url, err := startProxy(s.m.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	l := &Link{p: p, tb: t}
	cli, err := newClient([]string{url}, l.dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	l.cli = cli
	return cli, l
}

// dial opens one of the client's connections, and keeps it for Restore.
func (l *Link) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	return c, nil
}

// Pause holds the client's traffic in both directions; Resume delivers
// what was held. Requests sent meanwhile get no answer: what a stopped
// network, or a process paused on the other side, looks like.
func (l *Link) Pause() {
	l.p.PauseTx()
	l.p.PauseRx()
}

// Resume delivers the traffic Pause held, and lets new traffic through.
func (l *Link) Resume() {
	l.p.UnpauseTx()
	l.p.UnpauseRx()
}

// Drop discards the client's traffic in both directions (a cut cable):
// keep-alives are lost, so the client's sessions end by their local
// deadline and etcd expires their leases. Restore undoes it.
func (l *Link) Drop() {
	l.p.BlackholeTx()
	l.p.BlackholeRx()
}

// Restore lets traffic through again after Drop, on new connections:
// it closes the client's connections that were open during the cut and
// waits (up to 10 s) until the client reaches the server again. Bytes
// dropped in the middle of a connection, the headers of a request sent
// during the cut say, leave its two ends unable to read each other (gRPC
// compresses headers against what was sent before), where a real cut
// ends with the connection timed out and opened anew.
func (l *Link) Restore() {
	l.p.UnblackholeTx()
	l.p.UnblackholeRx()
	l.mu.Lock()
	cut := l.conns
	l.conns = nil
	l.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		// A read, which the client sends again on a new connection.
		_, err := l.cli.Get(ctx, "leasetest/restored", clientv3.WithSerializable())
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			l.tb.Errorf("leasetest: the client did not reach the server within 10s of Restore: %v", err)
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Delay adds d of latency in each direction; 0 removes it.
func (l *Link) Delay(d time.Duration) {
	if d <= 0 {
		l.p.UndelayTx()
		l.p.UndelayRx()
		return
	}
	l.p.DelayTx(d, 0)
	l.p.DelayRx(d, 0)
}
