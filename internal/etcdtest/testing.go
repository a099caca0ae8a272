package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// What does not depend on how the server runs (Name, Ctx, clients, the
// shared Env's run and its leak check, ETCD_ENDPOINTS) is package
// etcdproc's; this file holds only what an embedded server adds to it.

// StartT starts an embedded cluster for a test and stops it when the test
// ends. Tests that need control over members call it directly; it ignores
// ETCD_ENDPOINTS. The failures of its peer proxies' methods, if any, fail
// the test.
func StartT(tb testing.TB, cfg Config) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := start(ctx, cfg, tb)
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// ClientT opens a client to the cluster, closed when the test ends.
func (c *Cluster) ClientT(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return etcdproc.Client(tb, c.Endpoints())
}

// Env is etcdproc.Env with embedded members: the etcd a test package
// shares, set up once by Main, used by every test through Client.
type Env struct {
	etcdproc.Env
	// IgnoreStoppedMembers makes the leak check ignore the peer
	// connections (plain net/http client and server goroutines) that an
	// embedded member stopped and restarted in a test leaves behind in
	// etcd's raft transport. Only packages that stop members set it.
	IgnoreStoppedMembers bool
}

// Main starts the package's embedded etcd (or takes ETCD_ENDPOINTS), runs
// the tests, stops the etcd and then fails the run if any goroutine
// outlived it, other than the embedded server's own (serverLeaks). Use it
// from TestMain: os.Exit(env.Main(m, etcdtest.Config{})).
func (e *Env) Main(m *testing.M, cfg Config) int {
	ignore := serverLeaks()
	if e.IgnoreStoppedMembers {
		ignore = append(ignore, stoppedMemberLeaks()...)
	}
	return e.MainWith(m, func(ctx context.Context) ([]string, func(), error) {
		c, err := Start(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		if err := warmUp(c.Endpoints()); err != nil {
			c.Close()
			return nil, nil, err
		}
		return c.Endpoints(), c.Close, nil
	}, ignore...)
}

// serverLeaks lists goroutines that etcd's embedded server leaves behind
// after Close: its Lock RPC keeps sessions through an in-process client
// (the grpcproxy adapter) that the server never closes. They are etcd's, not
// this project's.
func serverLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter.newPipeStream.func1"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter.(*chanStream).RecvMsg"),
	}
}

// stoppedMemberLeaks are the goroutines of the HTTP connections between
// embedded members' peer ports that stay open once the members have
// stopped: etcd closes neither the client ends in its transports nor the
// server ends it accepted, and both are in this process.
func stoppedMemberLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	}
}

// LeakCheck is etcdproc.LeakCheck for a test in a process that runs an
// embedded server: the server's own goroutines (serverLeaks) are not
// counted.
func LeakCheck(tb testing.TB) {
	tb.Helper()
	etcdproc.LeakCheck(tb, serverLeaks()...)
}

// LeakCheckStoppedMembers is LeakCheck for a test that starts a cluster of
// its own with more than one member: the peer connections its members
// leave behind once stopped (see Env.IgnoreStoppedMembers) are etcd's and
// are not counted. Its package's Env sets IgnoreStoppedMembers too, for
// the check at the end of the run.
func LeakCheckStoppedMembers(tb testing.TB) {
	tb.Helper()
	etcdproc.LeakCheck(tb, append(serverLeaks(), stoppedMemberLeaks()...)...)
}

// warmUp makes one request, so that the server's serving goroutines, which
// it starts lazily, exist before any test's LeakCheck looks.
func warmUp(endpoints []string) error {
	cli, err := etcdproc.NewClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "leasefence-warm-up")
	return err
}
