package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Liveness regressions: a waiter whose turn has come is granted, whatever
// the lock did around its rule as it waited.

// grantWithin waits for a Lock call's result, failing the test if none
// comes within d or if it is an error.
func grantWithin(t *testing.T, ch <-chan lockResult, d time.Duration, what string) *lease.Lock {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(d):
		t.Fatalf("%s: not granted within %v of its turn", what, d)
	}
	return nil
}

// A Keeper's shared queue watch pauses after eight locks in a row granted
// alone. A lock that waits out a lock-delay after a loss has been granted
// alone, and pauses the watch only as the delay ends; a waiter of another
// session that joined the Keeper's copy of the queue meanwhile once kept
// trusting the watch its rule had counted on, which nothing resumed, and
// waited behind a free lock until its ctx ended.
func TestKeeperWaiterAcrossSharedWatchPause(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	opts := []lease.Option{lease.WithKeeper(k), lease.WithLockDelay(time.Second)}
	a, b := newSession(t, cli, opts...), newSession(t, cli, opts...)
	trials := 3
	if testing.Short() {
		trials = 1
	}
	for trial := range trials {
		name := etcdproc.Name(t, fmt.Sprintf("keeper-pause-%d", trial))
		// Seven locks (the first opens the watch, and reads), then one
		// that is lost: the next, the eighth in a row granted alone, waits
		// out the delay, then pauses the watch.
		for range 7 {
			l := mustLock(t, a, name)
			if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		lost := mustLock(t, newSession(t, cli, opts...), name)
		if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), lost.Key()); err != nil {
			t.Fatal(err)
		}
		expectDone(t, lost.Done(), 5*time.Second, "the lock whose key was deleted")
		ach := lockAsync(etcdproc.Ctx(t, 30*time.Second), a, name)
		waitQueued(t, cli, name, 1)
		bch := lockAsync(etcdproc.Ctx(t, 30*time.Second), b, name)
		waitQueued(t, cli, name, 2)
		first := grantWithin(t, ach, 5*time.Second, "the lock after the loss")
		expectPending(t, bch, 50*time.Millisecond)
		if err := first.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		l := grantWithin(t, bch, 5*time.Second, fmt.Sprintf("trial %d: the waiter that joined the copy before the watch paused", trial))
		if l.Token() <= first.Token() {
			t.Fatalf("the waiter's token %d is not above the holder's %d", l.Token(), first.Token())
		}
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// moveOffLease puts key again with no lease, as a careless operator or
// another program might: the key stays, but is no lock any more.
func moveOffLease(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).
		If(clientv3.Compare(clientv3.CreateRevision(key), ">", 0)).
		Then(clientv3.OpPut(key, "moved")).
		Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("moving %s off its lease: %v (succeeded %v)", key, err, resp != nil && resp.Succeeded)
	}
}

// A holder's key moved off its lease by someone else's put ends the
// holding, and the key, which stays, is no lock: the next waiter is
// granted, near the head and far back alike; Inspect and TryLock do not
// see it; and the former holder's session takes the name again, removing
// the key, instead of failing with ErrKeyInUse for good.
func TestKeyMovedOffLeaseFreesName(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for _, far := range []bool{false, true} {
		t.Run(fmt.Sprintf("far=%v", far), func(t *testing.T) {
			name := etcdproc.Name(t, "off-lease")
			hs := newSession(t, cli)
			holder := mustLock(t, hs, name)
			ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
			defer cancel()
			// Far: the waiter has more keys ahead than it follows; the
			// keys between are moved off their leases too, and their
			// waiters end with ErrKeyDeleted.
			var between []<-chan lockResult
			var betweenKeys []string
			if far {
				for i := range 3 {
					s := newSession(t, cli)
					between = append(between, lockAsync(ctx, s, name))
					betweenKeys = append(betweenKeys, keyOf(name, s))
					waitQueued(t, cli, name, 2+i)
				}
			}
			ws := newSession(t, cli)
			wch := lockAsync(ctx, ws, name)
			waitQueued(t, cli, name, 2+len(between))
			expectPending(t, wch, 100*time.Millisecond)
			for _, key := range betweenKeys {
				moveOffLease(t, cli, key)
			}
			for i, ch := range between {
				select {
				case r := <-ch:
					if !errors.Is(r.err, lease.ErrKeyDeleted) {
						t.Fatalf("waiter %d, its key moved off its lease: %v, want ErrKeyDeleted", i, r.err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("waiter %d, its key moved off its lease, did not return", i)
				}
			}
			moveOffLease(t, cli, holder.Key())
			expectDone(t, holder.Done(), 5*time.Second, "the holder whose key moved off its lease")
			if !errors.Is(holder.Err(), lease.ErrKeyDeleted) {
				t.Fatalf("holder's Err %v, want ErrKeyDeleted", holder.Err())
			}
			l := grantWithin(t, wch, 5*time.Second, "the waiter behind a key moved off its lease")
			if l.Token() <= holder.Token() {
				t.Fatalf("token %d not above the old holder's %d", l.Token(), holder.Token())
			}
			entries, err := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 || entries[0].Key != l.Key() {
				t.Fatalf("Inspect: %+v, want the new holder alone", entries)
			}
			if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
			// The old holder's session takes the name again.
			again, err := hs.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
			if err != nil {
				t.Fatalf("the old holder's session, its old key still there off its lease: %v", err)
			}
			if again.Key() != holder.Key() || again.Token() <= l.Token() {
				t.Fatalf("again: key %s token %d; want key %s, token above %d", again.Key(), again.Token(), holder.Key(), l.Token())
			}
			if err := again.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A put of a lock key that had no definite answer can be applied after the
// lock gave up and removed its key, even after the removal. The test sends
// such a put by hand, with the comparisons the session's put carried,
// after the session withdrew it (as a lock does after an unanswered put):
// it fails, so no key is left that no lock owns, and the session's next
// lock of the name is granted with a key of its own. A key on the lease
// that is not the session's (another client sharing the lease) is never
// taken: the lock fails with ErrKeyInUse.
func TestLateAppliedPutLeavesNoOrphan(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	latePut := func(name string, cmps []clientv3.Cmp) bool {
		t.Helper()
		resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).If(cmps...).
			Then(clientv3.OpPut(keyOf(name, s), "", clientv3.WithLease(s.Lease()))).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	for round := range 2 { // the second: a marker that exists already moves again
		name := etcdproc.Name(t, fmt.Sprintf("late-put-%d", round))
		if round == 1 {
			name = etcdproc.Name(t, "late-put-0")
		}
		sent := lease.PutCmps(s, name) // the put goes out, and no answer comes
		lease.Withdraw(s, name)
		if latePut(name, sent) {
			t.Fatalf("round %d: the put, applied after its withdrawal, created the key", round)
		}
		if keys := queueKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("round %d: keys left under the name: %v", round, keys)
		}
		l, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
		if err != nil {
			t.Fatalf("round %d: the session's next lock of the name: %v", round, err)
		}
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}

	name := etcdproc.Name(t, "shared-lease")
	if !latePut(name, nil) { // as a concurrency.Mutex sharing the lease would
		t.Fatal("put failed")
	}
	if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrKeyInUse) {
		t.Fatalf("Lock over another client's key on the lease: %v, want ErrKeyInUse", err)
	}
	if keys := queueKeys(t, cli, name); len(keys) != 1 {
		t.Fatalf("the other client's key: %v, want it untouched", keys)
	}
}
