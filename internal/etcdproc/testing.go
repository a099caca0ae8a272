package etcdproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// New gives a test a client to a real etcd: the cluster in ETCD_ENDPOINTS
// when it is set, or else a fresh member that is stopped when the test
// ends. The client is closed when the test ends.
func New(tb testing.TB) *clientv3.Client {
	tb.Helper()
	if eps, ok := External(); ok {
		return Client(tb, eps)
	}
	return StartT(tb, Config{}).ClientT(tb)
}

// StartT starts a member for a test and stops it when the test ends. It
// ignores ETCD_ENDPOINTS.
func StartT(tb testing.TB, cfg Config) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// startTimeout bounds a start, including the first build of the binary.
const startTimeout = 10 * time.Minute

// ClientT opens a client to the cluster, closed when the test ends.
func (c *Cluster) ClientT(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return Client(tb, c.Endpoints())
}

// Client opens a client to eps (NewClient), closed when the test ends.
func Client(tb testing.TB, eps []string) *clientv3.Client {
	tb.Helper()
	cli, err := NewClient(eps)
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Name returns a lock name unique to this run, so that tests sharing a
// cluster never meet each other's keys.
func Name(tb testing.TB, base string) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("random name: %v", err)
	}
	return "leasefence-test/" + hex.EncodeToString(b[:]) + "/" + base
}

// Env is the etcd a test package shares: set up once by Main, used by every
// test through Client. Sharing one member keeps a package's tests fast;
// tests that stop or restart members start a cluster of their own.
type Env struct {
	endpoints []string
}

// Main starts the package's etcd as a process (or takes ETCD_ENDPOINTS),
// runs the tests, stops the etcd and then fails the run if any goroutine
// outlived it. Use it from TestMain: os.Exit(env.Main(m, etcdproc.Config{})).
func (e *Env) Main(m *testing.M, cfg Config) int {
	return e.MainWith(m, func(ctx context.Context) ([]string, func(), error) {
		c, err := Start(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return c.Endpoints(), c.Close, nil
	})
}

// StartFunc starts a test package's etcd, within ctx, and returns its
// client URLs and a function that stops it.
type StartFunc func(ctx context.Context) (endpoints []string, stop func(), err error)

// MainWith is Main for an etcd that start starts (package etcdtest's
// embedded members, say). Goroutines that ignore matches are not counted
// as leaked: an embedded server's own, which it leaves behind when closed.
func (e *Env) MainWith(m *testing.M, start StartFunc, ignore ...goleak.Option) int {
	if eps, ok := External(); ok {
		e.endpoints = eps
		return withLeakCheck(m.Run(), ignore)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	eps, stop, err := start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	e.endpoints = eps
	code := m.Run()
	stop()
	return withLeakCheck(code, ignore)
}

func withLeakCheck(code int, ignore []goleak.Option) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(append(clientLeaks(), ignore...)...); err != nil {
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
		tb.Fatal("etcdproc: Env used outside Env.Main")
	}
	return Client(tb, e.endpoints)
}

// clientLeaks lists goroutines of etcd's client that outlive its Close by a
// moment: the lessor's loops end on their own once the client's context
// is done, without Close waiting for them.
func clientLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/v3.(*lessor).deadlineLoop"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/v3.(*lessor).sendKeepAliveLoop"),
	}
}

// LeakCheck makes the test fail if, once its cleanups have run, a
// goroutine is left that did not exist when LeakCheck was called, other
// than etcd's client's and those ignore matches. Call it first in the
// test, so that its check runs after every other cleanup.
func LeakCheck(tb testing.TB, ignore ...goleak.Option) {
	tb.Helper()
	opts := append(clientLeaks(), ignore...)
	opts = append(opts, goleak.IgnoreCurrent())
	tb.Cleanup(func() {
		if err := goleak.Find(opts...); err != nil {
			tb.Errorf("goroutines leaked: %v", err)
		}
	})
}

// Ctx is a context for one test's requests: it ends after d, or when the
// test ends.
func Ctx(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// Unanswered returns a client of an endpoint on loopback where nobody
// listens (a port bound, then released), closed when tb ends: etcd that
// cannot be reached. Requests on it wait until their context ends.
func Unanswered(tb testing.TB) (*clientv3.Client, string) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli, addr
}
