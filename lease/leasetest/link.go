package leasetest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/proxy"

	"github.com/leasefence/leasefence/internal/etcdtest"
)

// Link is the network between one client and the server: etcd's fault
// proxy, on loopback, through which that client alone reaches the server.
// Its methods are safe for concurrent use; each fault lasts until undone.
type Link struct {
	p proxy.Server
}

// FaultyClient opens a client that reaches the server only through a Link
// of its own. Both are closed when the test ends.
func (s *Server) FaultyClient(t testing.TB) (*clientv3.Client, *Link) {
	t.Helper()
	p, cli, _ := etcdtest.ProxiedClient(t, s.Endpoints()[0])
	return cli, &Link{p: p}
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

// Restore lets traffic through again after Drop.
func (l *Link) Restore() {
	l.p.UnblackholeTx()
	l.p.UnblackholeRx()
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
