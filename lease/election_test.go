package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func mustCampaign(t *testing.T, s *lease.Session, name, value string) *lease.Leadership {
	t.Helper()
	e, err := s.Campaign(etcdproc.Ctx(t, 30*time.Second), name, value)
	if err != nil {
		t.Fatalf("Campaign(%q): %v", name, err)
	}
	return e
}

func mustObserve(t *testing.T, cli *clientv3.Client, name string) *lease.Observer {
	t.Helper()
	o, err := lease.Observe(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if err != nil {
		t.Fatalf("Observe(%q): %v", name, err)
	}
	t.Cleanup(o.Close)
	return o
}

// nextLeader waits for the observer's next leader.
func nextLeader(t *testing.T, o *lease.Observer, within time.Duration) lease.Leader {
	t.Helper()
	select {
	case ld, ok := <-o.Leaders():
		if !ok {
			t.Fatalf("observer stopped: %v", o.Err())
		}
		return ld
	case <-time.After(within):
		t.Fatalf("no leader observed within %v", within)
	}
	panic("unreachable")
}

// expectLeader waits until the observer reports a leader with this token
// and value. Leaders seen on the way must come in order.
func expectLeader(t *testing.T, o *lease.Observer, token int64, value string) lease.Leader {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var prev lease.Leader
	for {
		ld := nextLeader(t, o, time.Until(deadline))
		if ld.Token < prev.Token || (ld.Token == prev.Token && ld.Revision <= prev.Revision) {
			t.Fatalf("observer went back: %+v after %+v", ld, prev)
		}
		prev = ld
		if ld.Token == token && ld.Value == value {
			return ld
		}
		if ld.Token > token {
			t.Fatalf("observed %+v, past the expected token %d", ld, token)
		}
	}
}

func TestCampaignProclaimResign(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "election")
	a, b := newSession(t, cli), newSession(t, cli)
	o := mustObserve(t, cli, name)

	ea := mustCampaign(t, a, name, "a:1")
	if ea.Key() != fmt.Sprintf("%s/%x", name, int64(a.Lease())) {
		t.Errorf("Key() = %q, not etcd's layout", ea.Key())
	}
	seen := expectLeader(t, o, ea.Token(), "a:1")
	if seen.Key != ea.Key() || seen.Name != name {
		t.Errorf("observed %+v, want key %q", seen, ea.Key())
	}
	got, err := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if err != nil || got.Token != ea.Token() || got.Value != "a:1" {
		t.Fatalf("CurrentLeader = %+v, %v", got, err)
	}

	waiting := make(chan *lease.Leadership, 1)
	go func() {
		eb, err := b.Campaign(etcdproc.Ctx(t, 30*time.Second), name, "b:1")
		if err != nil {
			t.Errorf("b's Campaign: %v", err)
		}
		waiting <- eb
	}()
	waitQueued(t, cli, name, 2)

	if err := ea.Proclaim(etcdproc.Ctx(t, 30*time.Second), "a:2"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	if ea.Value() != "a:2" {
		t.Errorf("Value() = %q after Proclaim", ea.Value())
	}
	expectLeader(t, o, ea.Token(), "a:2")
	select {
	case <-waiting:
		t.Fatal("b became leader while a leads")
	default:
	}

	if err := ea.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if !errors.Is(ea.Err(), lease.ErrUnlocked) {
		t.Errorf("Err() after Resign = %v", ea.Err())
	}
	if err := ea.Proclaim(etcdproc.Ctx(t, 30*time.Second), "a:3"); !errors.Is(err, lease.ErrUnlocked) {
		t.Errorf("Proclaim after Resign: %v, want ErrUnlocked", err)
	}
	var eb *lease.Leadership
	select {
	case eb = <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("b not leader 5s after a resigned")
	}
	if eb == nil {
		t.FailNow()
	}
	if eb.Token() <= ea.Token() {
		t.Errorf("b's token %d not above a's %d", eb.Token(), ea.Token())
	}
	expectLeader(t, o, eb.Token(), "b:1")
	if err := eb.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), cli, name); !errors.Is(err, lease.ErrNoLeader) {
		t.Errorf("CurrentLeader with nobody campaigning: %v, want ErrNoLeader", err)
	}
}

// Loss of leadership shows exactly as loss of a lock.
func TestLeadershipLoss(t *testing.T) {
	etcdproc.LeakCheck(t)
	cases := []struct {
		name string
		end  func(t *testing.T, cli *clientv3.Client, s *lease.Session, e *lease.Leadership)
		want error
	}{
		{"lease revoked", func(t *testing.T, cli *clientv3.Client, s *lease.Session, _ *lease.Leadership) {
			cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease())
		}, lease.ErrLost},
		{"key deleted", func(t *testing.T, cli *clientv3.Client, _ *lease.Session, e *lease.Leadership) {
			cli.Delete(etcdproc.Ctx(t, 30*time.Second), e.Key())
		}, lease.ErrKeyDeleted},
		{"session closed", func(t *testing.T, _ *clientv3.Client, s *lease.Session, _ *lease.Leadership) {
			s.Close()
		}, lease.ErrSessionClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcd.Client(t)
			s := newSession(t, cli)
			e := mustCampaign(t, s, etcdproc.Name(t, "lead-loss"), "me")
			work, cancel := e.Context(etcdproc.Ctx(t, 30*time.Second))
			defer cancel()
			tc.end(t, cli, s, e)
			expectDone(t, e.Done(), 2*time.Second, "Leadership.Done")
			expectDone(t, work.Done(), time.Second, "Leadership.Context")
			if !errors.Is(e.Err(), tc.want) || !errors.Is(context.Cause(work), tc.want) {
				t.Errorf("Err() = %v, cause %v, want %v", e.Err(), context.Cause(work), tc.want)
			}
			if err := e.Proclaim(etcdproc.Ctx(t, 30*time.Second), "again"); !errors.Is(err, tc.want) {
				t.Errorf("Proclaim after loss: %v, want %v", err, tc.want)
			}
		})
	}
}

// A Proclaim that finds the key gone ends the leadership and never
// recreates the key.
func TestProclaimFindsKeyGone(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	e := mustCampaign(t, s, etcdproc.Name(t, "proclaim-gone"), "v1")
	// Delete and recreate through a foreign lease in one txn, so the key
	// exists but is not ours, before our monitor can react.
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), g.ID)
	if _, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).Then(clientv3.OpDelete(e.Key())).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), e.Key(), "intruder", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	err = e.Proclaim(etcdproc.Ctx(t, 30*time.Second), "v2")
	if !errors.Is(err, lease.ErrKeyDeleted) {
		t.Fatalf("Proclaim on a replaced key: %v, want ErrKeyDeleted", err)
	}
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), e.Key())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "intruder" {
		t.Fatalf("replaced key changed by Proclaim: %v %v", resp.Kvs, err)
	}
}

// concurrency.Election and this package share a key layout: each waits for
// the other, and each reads the other's leader and token.
func TestInteropConcurrencyElection(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "interop-elect")
	cs, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	theirs := concurrency.NewElection(cs, name)
	if err := theirs.Campaign(etcdproc.Ctx(t, 30*time.Second), "theirs"); err != nil {
		t.Fatal(err)
	}
	o := mustObserve(t, cli, name)
	seen := expectLeader(t, o, theirs.Rev(), "theirs")
	if seen.Key != theirs.Key() {
		t.Errorf("observed key %q, theirs is %q", seen.Key, theirs.Key())
	}

	s := newSession(t, cli)
	ch := make(chan *lease.Leadership, 1)
	go func() {
		e, err := s.Campaign(etcdproc.Ctx(t, 30*time.Second), name, "ours")
		if err != nil {
			t.Errorf("Campaign: %v", err)
		}
		ch <- e
	}()
	waitQueued(t, cli, name, 2)
	select {
	case <-ch:
		t.Fatal("we led while concurrency.Election leads")
	case <-time.After(200 * time.Millisecond):
	}
	if err := theirs.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	var ours *lease.Leadership
	select {
	case ours = <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("not leader 5s after concurrency.Election resigned")
	}
	if ours == nil {
		t.FailNow()
	}
	resp, err := theirs.Leader(etcdproc.Ctx(t, 30*time.Second))
	if err != nil || string(resp.Kvs[0].Value) != "ours" || resp.Kvs[0].CreateRevision != ours.Token() {
		t.Fatalf("concurrency.Election.Leader = %v, %v; want our value and token %d", resp, err, ours.Token())
	}
	expectLeader(t, o, ours.Token(), "ours")
	ours.Resign(etcdproc.Ctx(t, 30*time.Second))
}

// Nested names are separate elections, as they are separate locks.
func TestObserveIgnoresNestedNames(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "nested-elect")
	s1, s2 := newSession(t, cli), newSession(t, cli)
	inner := mustCampaign(t, s1, name+"/shard", "inner")
	o := mustObserve(t, cli, name)
	if _, err := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), cli, name); !errors.Is(err, lease.ErrNoLeader) {
		t.Fatalf("CurrentLeader sees the nested election: %v", err)
	}
	outer := mustCampaign(t, s2, name, "outer")
	ld := expectLeader(t, o, outer.Token(), "outer")
	if ld.Token == inner.Token() {
		t.Fatal("observed the nested leader")
	}
	inner.Resign(etcdproc.Ctx(t, 30*time.Second))
	outer.Resign(etcdproc.Ctx(t, 30*time.Second))
}

// An observer cut off from etcd while the leader changes reports the
// current leader once it is back, even after the store was compacted, and
// never reports leaders out of order.
func TestObserverCatchesUpAfterReconnect(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	target := etcd.Endpoints()[0]
	p, viaProxy, url := etcdproc.ProxiedClient(t, target)
	name := etcdproc.Name(t, "observe-reconnect")
	a, b := newSession(t, cli), newSession(t, cli)
	o := mustObserve(t, viaProxy, name)
	ea := mustCampaign(t, a, name, "a")
	expectLeader(t, o, ea.Token(), "a")

	addr := strings.TrimPrefix(url, "http://")
	p.Close()
	if err := ea.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	eb := mustCampaign(t, b, name, "b")
	if err := eb.Proclaim(etcdproc.Ctx(t, 30*time.Second), "b2"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), name+"-noise", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(etcdproc.Ctx(t, 30*time.Second), r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	etcdproc.ProxyAt(t, addr, target)
	// Cleanups run last first: the client must go before the new proxy,
	// whose Close waits for the client's connection to end.
	t.Cleanup(func() { o.Close(); viaProxy.Close() })
	expectLeader(t, o, eb.Token(), "b2")
	eb.Resign(etcdproc.Ctx(t, 30*time.Second))
}

func TestObserverClose(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	o, err := lease.Observe(ctx, cli, etcdproc.Name(t, "observe-close"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Err() != nil {
		t.Errorf("Err() of a running observer = %v", o.Err())
	}
	o.Close()
	if _, ok := <-o.Leaders(); ok {
		t.Error("Leaders not closed after Close")
	}
	if !errors.Is(o.Err(), lease.ErrObserverClosed) {
		t.Errorf("Err() after Close = %v", o.Err())
	}
	o.Close() // again: no effect

	o2, err := lease.Observe(ctx, cli, etcdproc.Name(t, "observe-cancel"))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	expectDone(t, o2.Done(), time.Second, "Observer.Done after ctx cancel")
	if !errors.Is(o2.Err(), context.Canceled) {
		t.Errorf("Err() after cancel = %v", o2.Err())
	}
}

func TestElectionBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	if _, err := s.Campaign(etcdproc.Ctx(t, 30*time.Second), "", "v"); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("Campaign with an empty name: %v", err)
	}
	if _, err := lease.Observe(etcdproc.Ctx(t, 30*time.Second), nil, "x"); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("Observe with a nil client: %v", err)
	}
	if _, err := lease.Observe(etcdproc.Ctx(t, 30*time.Second), cli, "x/"); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("Observe with a bad name: %v", err)
	}
	if _, err := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), cli, ""); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("CurrentLeader with an empty name: %v", err)
	}
}

// ReaderValue is no leader's value: a leader's key with it would read as
// a reader's, and a read lock would be granted beside the leader.
// Campaign refuses it before sending anything, so no key is left.
func TestCampaignRefusesReaderValue(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "campaign-reader-value")
	s := newSession(t, cli)
	e, err := s.Campaign(etcdproc.Ctx(t, 30*time.Second), name, lease.ReaderValue)
	if !errors.Is(err, lease.ErrInvalidArgument) || e != nil {
		t.Fatalf("Campaign with ReaderValue: won %v, %v, want ErrInvalidArgument", e != nil, err)
	}
	if n := strings.Count(err.Error(), "lease:"); n != 1 {
		t.Errorf("error %q names the package %d times", err, n)
	}
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), name, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("%d keys under %q after a refused Campaign", resp.Count, name)
	}
	// Lead campaigns with the same value: refused for good, fn never run.
	err = lease.Lead(etcdproc.Ctx(t, 30*time.Second), cli, name, lease.ReaderValue, func(context.Context, *lease.Leadership) error {
		t.Error("Lead ran fn with ReaderValue")
		return nil
	})
	if !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("Lead with ReaderValue: %v, want ErrInvalidArgument", err)
	}
}

// A Proclaim of ReaderValue is refused and changes nothing: the key keeps
// its value (read from etcd), the leadership stays held with its value,
// and readers of another session still wait.
func TestProclaimRefusesReaderValue(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "proclaim-reader-value")
	e := mustCampaign(t, newSession(t, cli), name, "a:1")
	before, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), e.Key())
	if err != nil || len(before.Kvs) != 1 {
		t.Fatalf("leader key: %v %v", before.Kvs, err)
	}

	if err := e.Proclaim(etcdproc.Ctx(t, 30*time.Second), lease.ReaderValue); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("Proclaim(ReaderValue): %v, want ErrInvalidArgument", err)
	}
	after, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), e.Key())
	if err != nil || len(after.Kvs) != 1 {
		t.Fatalf("leader key after the refused Proclaim: %v %v", after.Kvs, err)
	}
	if kv := after.Kvs[0]; string(kv.Value) != "a:1" || kv.ModRevision != before.Kvs[0].ModRevision {
		t.Fatalf("leader key after the refused Proclaim: value %q mod revision %d, want a:1 at %d",
			kv.Value, kv.ModRevision, before.Kvs[0].ModRevision)
	}
	if e.Err() != nil || e.Value() != "a:1" {
		t.Fatalf("after the refused Proclaim: Err %v, Value %q, want held with a:1", e.Err(), e.Value())
	}

	// Neither check can pass by chance: TryRLock answers at once, and a
	// granted RLock returns before its deadline.
	r := newSession(t, cli)
	if l, err := r.TryRLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("TryRLock beside the leader: granted %v, %v, want ErrLocked", l != nil, err)
	}
	ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 300*time.Millisecond)
	defer cancel()
	if l, err := r.RLock(ctx, name); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RLock beside the leader: granted %v, %v, want DeadlineExceeded", l != nil, err)
	}

	if err := e.Proclaim(etcdproc.Ctx(t, 30*time.Second), "a:2"); err != nil || e.Value() != "a:2" {
		t.Fatalf("Proclaim after the refused one: %v, value %q", err, e.Value())
	}
}
