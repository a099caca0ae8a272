package lease_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

// etcd is the single embedded member (or ETCD_ENDPOINTS) shared by the
// package's tests. Env.Main fails the run if a goroutine outlives it,
// except the peer connections a test's own three-member cluster leaves
// (TestWaiterNotStrandedByLaggingMember): they are etcd's, and the
// package's code opens no HTTP connection.
var etcd = etcdproc.Env{}

func TestMain(m *testing.M) {
	if os.Getenv(exampleenv.ChildEnv) == delayChildRole {
		os.Exit(runDelayChild())
	}
	if os.Getenv(exampleenv.ChildEnv) == pauseChildRole {
		os.Exit(runPauseChild())
	}
	os.Exit(etcd.Main(m, etcdproc.Config{}))
}

// shortTTL is the shortest lease etcd grants with default timing.
const shortTTL = 2 * time.Second

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

// lockResult is the outcome of a Lock call run in the background.
type lockResult struct {
	l   *lease.Lock
	err error
}

func lockAsync(ctx context.Context, s *lease.Session, name string) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := s.Lock(ctx, name)
		ch <- lockResult{l, err}
	}()
	return ch
}

// waitQueued waits until n keys are queued under name: an event, not a
// guess at how long a Lock call takes to enqueue.
func waitQueued(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	wch := cli.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	for len(queueKeys(t, cli, name)) < n {
		select {
		case <-wch:
		case <-ctx.Done():
			t.Fatalf("%d keys never queued under %q", n, name)
		}
	}
}

// expectPending fails if a result arrives on ch within d, or is ready
// when d is over. A zero d only checks that no result is ready: a select
// between a ready result and an expired timer picks at random, so the
// last look never races one.
func expectPending(t *testing.T, ch <-chan lockResult, d time.Duration) {
	t.Helper()
	if d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case r := <-ch:
			t.Fatalf("Lock returned while the lock was held: lock=%v err=%v", r.l, r.err)
		case <-timer.C:
		}
	}
	select {
	case r := <-ch:
		t.Fatalf("Lock returned while the lock was held: lock=%v err=%v", r.l, r.err)
	default:
	}
}

func expectDone(t *testing.T, done <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("%s: not done after %v", what, within)
	}
}

// keyOf is the queue key session s puts for name.
func keyOf(name string, s *lease.Session) string { return fmt.Sprintf("%s/%x", name, int64(s.Lease())) }
