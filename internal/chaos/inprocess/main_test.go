// Package inprocess_test holds the tests of package lease that need etcd's
// server in process, or its server module: a member held mid-apply, a
// snapshot restored under a running session, and etcd's own Lock and
// Election services. They live in the fault suite's module so that the
// library's module does not require etcd's server.
package inprocess_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// etcd is the single embedded member (or ETCD_ENDPOINTS) shared by the
// package's tests. The peer connections that a test's own three-member
// cluster leaves once stopped are etcd's, not leaks of ours.
var etcd = etcdtest.Env{IgnoreStoppedMembers: true}

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdtest.Config{})) }

func newSession(t *testing.T, cli *clientv3.Client, opts ...lease.Option) *lease.Session {
	t.Helper()
	s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustLock(t *testing.T, s *lease.Session, name string) *lease.Lock {
	t.Helper()
	l, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatalf("Lock(%q): %v", name, err)
	}
	return l
}

func mustCampaign(t *testing.T, s *lease.Session, name, value string) *lease.Leadership {
	t.Helper()
	e, err := s.Campaign(etcdproc.Ctx(t, 30*time.Second), name, value)
	if err != nil {
		t.Fatalf("Campaign(%q): %v", name, err)
	}
	return e
}

// queueKeys lists the keys queued under a lock name, nested locks excluded.
func queueKeys(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		if !strings.Contains(strings.TrimPrefix(string(kv.Key), name+"/"), "/") {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys
}

type lockResult struct {
	l   *lease.Lock
	err error
}

// lockAsync calls Lock on its own goroutine; the result comes on the
// channel once the call returns.
func lockAsync(ctx context.Context, s *lease.Session, name string) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := s.Lock(ctx, name)
		ch <- lockResult{l, err}
	}()
	return ch
}

func mustUnlock(t *testing.T, l *lease.Lock) {
	t.Helper()
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}
