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
		return client(tb, eps)
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
// test through Client. Sharing one member keeps a package's tests fast.
type Env struct {
	endpoints []string
}

// Main starts the package's etcd (or takes ETCD_ENDPOINTS), runs the tests,
// stops the etcd and then fails the run if any goroutine outlived it. Use it
// from TestMain: os.Exit(env.Main(m, etcdproc.Config{})).
func (e *Env) Main(m *testing.M, cfg Config) int {
	if eps, ok := External(); ok {
		e.endpoints = eps
		return withLeakCheck(m.Run())
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	c, err := Start(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start etcd:", err)
		return 1
	}
	e.endpoints = c.Endpoints()
	code := m.Run()
	c.Close()
	return withLeakCheck(code)
}

func withLeakCheck(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(clientLeaks()...); err != nil {
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
	return client(tb, e.endpoints)
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
// goroutine is left that did not exist when LeakCheck was called. Call it
// first in the test, so that its check runs after every other cleanup.
func LeakCheck(tb testing.TB) {
	tb.Helper()
	opts := append(clientLeaks(), goleak.IgnoreCurrent())
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
