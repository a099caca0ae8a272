package fence_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

var etcd etcdproc.Env

func TestMain(m *testing.M) { os.Exit(etcd.Main(m, etcdproc.Config{})) }

func newLock(t testing.TB, cli *clientv3.Client, name string) (*lease.Session, *lease.Lock) {
	t.Helper()
	s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	l, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	return s, l
}

func get(t testing.TB, cli *clientv3.Client, key string) (string, bool) {
	t.Helper()
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}

func revision(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// token is a Holder with a fixed key and token.
type token struct {
	key string
	tok int64
}

func (h token) Name() string { return h.key[:max(0, strings.LastIndex(h.key, "/"))] }
func (h token) Key() string  { return h.key }
func (h token) Token() int64 { return h.tok }

func testCtxWithTimeout(t testing.TB, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), d)
}

// lockPut makes a lock key as a session does: a lease of its own, and
// name + "/" + the lease ID in lowercase hex put on it with that lease.
// It returns the key as a Holder, with the key's creation revision as
// its token, and the lease.
func lockPut(t testing.TB, cli *clientv3.Client, name string) (token, clientv3.LeaseID) {
	t.Helper()
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("%s/%x", name, int64(g.ID))
	resp, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), key, "", clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	return token{key, resp.Header.Revision}, g.ID
}

// leasedPut puts key with an empty value on a lease of its own. Held
// takes only a key named after its lease (lockPut).
func leasedPut(t testing.TB, cli *clientv3.Client, key string) *clientv3.PutResponse {
	t.Helper()
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), key, "", clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
