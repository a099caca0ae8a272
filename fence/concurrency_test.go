package fence_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

func concurrencySession(t *testing.T, cli *clientv3.Client) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// FromMutex: the token is the key's creation revision, also after a
// contended grant (where the mutex's header revision is a later one), and
// the guards work with it while held and refuse it once unlocked.
func TestFromMutexContended(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "mutex")
	data, rec := name+"-data", name+"-fence"
	m1 := concurrency.NewMutex(concurrencySession(t, cli), name)
	m2 := concurrency.NewMutex(concurrencySession(t, cli), name)
	if err := m1.Lock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- m2.Lock(etcdproc.Ctx(t, 30*time.Second)) }()
	waitKeys(t, cli, name, 2)
	h1 := fence.FromMutex(m1)
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h1), fence.Resource(rec, h1.Token())).Then(clientv3.OpPut(data, "m1")).Commit(); err != nil {
		t.Fatalf("write of the holder: %v", err)
	}
	if err := m1.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	h2 := fence.FromMutex(m2)
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), m2.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading m2's key: %v %v", resp, err)
	}
	if created := resp.Kvs[0].CreateRevision; h2.Token() != created || h2.Key() != m2.Key() || h2.Name() != name {
		t.Fatalf("FromMutex = %s %s %d, want %s %s %d", h2.Name(), h2.Key(), h2.Token(), name, m2.Key(), created)
	}
	if m2.Header().Revision == h2.Token() {
		t.Fatalf("the contended grant's header revision equals the token (%d): the test shows nothing", h2.Token())
	}
	if h2.Token() <= h1.Token() {
		t.Fatalf("token %d not above %d", h2.Token(), h1.Token())
	}
	// The old holder, unlocked: Held refuses it, and Resource refuses its
	// token once the new holder wrote.
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h1)).Then(clientv3.OpPut(data, "late")).Commit(); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("Held after Unlock: %v, want ErrNotHeld", err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h2), fence.Resource(rec, h2.Token())).Then(clientv3.OpPut(data, "m2")).Commit(); err != nil {
		t.Fatalf("write of the new holder: %v", err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, h1.Token())).Then(clientv3.OpPut(data, "late")).Commit(); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("Resource with the old token: %v, want ErrStale", err)
	}
	if err := m2.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The holder outlives the mutex's memory: still the same key and token.
	if h2.Key() == "" || h2.Token() != resp.Kvs[0].CreateRevision {
		t.Fatalf("holder changed after Unlock: %s %d", h2.Key(), h2.Token())
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h2)).Then(clientv3.OpPut(data, "late")).Commit(); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("Held after the second Unlock: %v, want ErrNotHeld", err)
	}
	// Before Lock: a holder every guard refuses as bad input.
	fresh := fence.FromMutex(concurrency.NewMutex(concurrencySession(t, cli), name))
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(fresh)).Then(clientv3.OpPut(data, "x")).Commit(); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("holder of an unlocked mutex: %v, want ErrInvalidArgument", err)
	}
}

// FromElection: the token is Election.Rev, the leader key's creation
// revision, also after a contended campaign.
func TestFromElectionContended(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "election")
	e1 := concurrency.NewElection(concurrencySession(t, cli), name)
	e2 := concurrency.NewElection(concurrencySession(t, cli), name)
	if err := e1.Campaign(etcdproc.Ctx(t, 30*time.Second), "one"); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(etcdproc.Ctx(t, 30*time.Second), "two") }()
	waitKeys(t, cli, name, 2)
	h1 := fence.FromElection(e1)
	if err := e1.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	h2 := fence.FromElection(e2)
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), e2.Key())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != h2.Token() || h2.Token() <= h1.Token() {
		t.Fatalf("FromElection token %d (before %d), key %v %v", h2.Token(), h1.Token(), resp, err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h2)).Then(clientv3.OpPut(name+"-data", "two")).Commit(); err != nil {
		t.Fatalf("leader's write: %v", err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h1)).Then(clientv3.OpPut(name+"-data", "late")).Commit(); !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("resigned leader's write: %v, want ErrNotHeld", err)
	}
	if err := e2.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// waitKeys waits until n keys are queued under name.
func waitKeys(t *testing.T, cli *clientv3.Client, name string, n int64) {
	t.Helper()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	wch := cli.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	for {
		resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count >= n {
			return
		}
		select {
		case <-wch:
		case <-ctx.Done():
			t.Fatalf("%d keys never queued under %s", n, name)
		}
	}
}
