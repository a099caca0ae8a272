package etcdtest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// New gives a test a client to a real etcd: the cluster in ETCD_ENDPOINTS
// when it is set, or else a fresh single embedded member that is stopped when
// the test ends. The client is closed when the test ends.
func New(tb testing.TB) *clientv3.Client {
	tb.Helper()
	if eps, ok := External(); ok {
		return client(tb, eps)
	}
	c := StartT(tb, Config{})
	return client(tb, c.Endpoints())
}

// StartT starts an embedded cluster for a test and stops it when the test
// ends. Tests that need control over members call it directly; it ignores
// ETCD_ENDPOINTS.
func StartT(tb testing.TB, cfg Config) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// ClientT opens a client to the cluster, closed when the test ends.
func (c *Cluster) ClientT(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return client(tb, c.Endpoints())
}

func client(tb testing.TB, eps []string) *clientv3.Client {
	tb.Helper()
	cli, err := NewClient(eps)
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Name returns a lock name unique to this run (etcdproc.Name).
func Name(tb testing.TB, base string) string { return etcdproc.Name(tb, base) }

// Env is the etcd a test package shares: set up once by Main, used by every
// test through Client. Sharing one member keeps a package's tests fast;
// tests that stop or restart members start a cluster of their own.
type Env struct {
	endpoints []string
	// IgnoreStoppedMembers makes the leak check ignore the peer
	// connections (plain net/http client and server goroutines) that an
	// embedded member stopped and restarted in a test leaves behind in
	// etcd's raft transport. Only packages that stop members set it.
	IgnoreStoppedMembers bool
}

// Main starts the package's etcd (or takes ETCD_ENDPOINTS), runs the tests,
// stops the etcd and then fails the run if any goroutine outlived it. Use it
// from TestMain: os.Exit(env.Main(m)).
func (e *Env) Main(m *testing.M, cfg Config) int {
	if eps, ok := External(); ok {
		e.endpoints = eps
		code := m.Run()
		return e.withLeakCheck(code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c, err := Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	e.endpoints = c.Endpoints()
	if err := warmUp(e.endpoints); err != nil {
		c.Close()
		fmt.Fprintln(os.Stderr, "etcd not serving:", err)
		return 1
	}
	code := m.Run()
	c.Close()
	return e.withLeakCheck(code)
}

func (e *Env) withLeakCheck(code int) int {
	if code != 0 {
		return code
	}
	opts := etcdServerLeaks()
	if e.IgnoreStoppedMembers {
		opts = append(opts,
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"))
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
		return 1
	}
	return 0
}

// Endpoints lists the shared etcd's client URLs.
func (e *Env) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// Client opens a client to the shared etcd, closed when the test ends.
func (e *Env) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	if len(e.endpoints) == 0 {
		tb.Fatal("etcdtest: Env used outside Env.Main")
	}
	return client(tb, e.endpoints)
}

// etcdServerLeaks lists goroutines that etcd's embedded server leaves behind
// after Close: its Lock RPC keeps sessions through an in-process client
// (the grpcproxy adapter) that the server never closes. They are etcd's, not
// this project's.
func etcdServerLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter.newPipeStream.func1"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter.(*chanStream).RecvMsg"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/v3.(*lessor).deadlineLoop"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/v3.(*lessor).sendKeepAliveLoop"),
	}
}

// LeakCheck makes the test fail if, once its cleanups have run, a
// goroutine is left that did not exist when LeakCheck was called. Call it
// first in the test, so that its check runs after every other cleanup.
func LeakCheck(tb testing.TB) {
	tb.Helper()
	opts := append(etcdServerLeaks(), goleak.IgnoreCurrent())
	tb.Cleanup(func() {
		if err := goleak.Find(opts...); err != nil {
			tb.Errorf("goroutines leaked: %v", err)
		}
	})
}

// warmUp makes one request, so that the server's serving goroutines, which
// it starts lazily, exist before any test's LeakCheck looks.
func warmUp(endpoints []string) error {
	cli, err := NewClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "leasefence-warm-up")
	return err
}

// Ctx is a context for one test's requests (etcdproc.Ctx).
func Ctx(tb testing.TB, d time.Duration) context.Context { return etcdproc.Ctx(tb, d) }

// Unanswered returns a client of an endpoint where nobody listens
// (etcdproc.Unanswered).
func Unanswered(tb testing.TB) (*clientv3.Client, string) { return etcdproc.Unanswered(tb) }
