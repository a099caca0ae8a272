package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdtest"
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
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	opts := []lease.Option{lease.WithKeeper(k), lease.WithLockDelay(time.Second)}
	a, b := newSession(t, cli, opts...), newSession(t, cli, opts...)
	trials := 3
	if testing.Short() {
		trials = 1
	}
	for trial := range trials {
		name := etcdtest.Name(t, fmt.Sprintf("keeper-pause-%d", trial))
		// Seven locks (the first opens the watch, and reads), then one
		// that is lost: the next, the eighth in a row granted alone, waits
		// out the delay, then pauses the watch.
		for range 7 {
			l := mustLock(t, a, name)
			if err := l.Unlock(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		}
		lost := mustLock(t, newSession(t, cli, opts...), name)
		if _, err := cli.Delete(testCtx(t), lost.Key()); err != nil {
			t.Fatal(err)
		}
		expectDone(t, lost.Done(), 5*time.Second, "the lock whose key was deleted")
		ach := lockAsync(testCtx(t), a, name)
		waitQueued(t, cli, name, 1)
		bch := lockAsync(testCtx(t), b, name)
		waitQueued(t, cli, name, 2)
		first := grantWithin(t, ach, 5*time.Second, "the lock after the loss")
		expectPending(t, bch, 50*time.Millisecond)
		if err := first.Unlock(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		l := grantWithin(t, bch, 5*time.Second, fmt.Sprintf("trial %d: the waiter that joined the copy before the watch paused", trial))
		if l.Token() <= first.Token() {
			t.Fatalf("the waiter's token %d is not above the holder's %d", l.Token(), first.Token())
		}
		if err := l.Unlock(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// moveOffLease puts key again with no lease, as a careless operator or
// another program might: the key stays, but is no lock any more.
func moveOffLease(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	resp, err := cli.Txn(testCtx(t)).
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
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	for _, far := range []bool{false, true} {
		t.Run(fmt.Sprintf("far=%v", far), func(t *testing.T) {
			name := etcdtest.Name(t, "off-lease")
			hs := newSession(t, cli)
			holder := mustLock(t, hs, name)
			ctx, cancel := context.WithCancel(testCtx(t))
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
			entries, err := lease.Inspect(testCtx(t), cli, name)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 || entries[0].Key != l.Key() {
				t.Fatalf("Inspect: %+v, want the new holder alone", entries)
			}
			if err := l.Unlock(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			// The old holder's session takes the name again.
			again, err := hs.TryLock(testCtx(t), name)
			if err != nil {
				t.Fatalf("the old holder's session, its old key still there off its lease: %v", err)
			}
			if again.Key() != holder.Key() || again.Token() <= l.Token() {
				t.Fatalf("again: key %s token %d; want key %s, token above %d", again.Key(), again.Token(), holder.Key(), l.Token())
			}
			if err := again.Unlock(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A put of a lock key that had no definite answer can be applied after the
// lock gave up and removed its key: the key then sits on the live
// session's lease, owned by no lock. The test applies such a put by hand
// after the session marked the key suspect (as an unanswered put does).
// Another session's waiter behind it is granted within the sweep's bound,
// and the session's own next lock of the name replaces it at once. A key
// on the lease that no unanswered put explains is another client's: the
// session's lock refuses to share it (ErrKeyInUse).
func TestOrphanOfLateAppliedPutIsRemoved(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	putOnLease := func(name string) int64 {
		t.Helper()
		resp, err := cli.Put(testCtx(t), keyOf(name, s), "", clientv3.WithLease(s.Lease()))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	t.Run("swept", func(t *testing.T) {
		name := etcdtest.Name(t, "orphan-swept")
		lease.SuspectOrphan(s, keyOf(name, s))
		putOnLease(name) // the late apply
		wch := lockAsync(testCtx(t), newSession(t, cli), name)
		waitQueued(t, cli, name, 2)
		start := time.Now()
		l := grantWithin(t, wch, lease.OrphanSweep+2*time.Second, "the waiter behind an orphan")
		t.Logf("granted %v after queueing behind the orphan (sweep every %v)", time.Since(start).Round(time.Millisecond), lease.OrphanSweep)
		if err := l.Unlock(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("replaced by the next lock", func(t *testing.T) {
		name := etcdtest.Name(t, "orphan-next")
		lease.SuspectOrphan(s, keyOf(name, s))
		orphan := putOnLease(name)
		l, err := s.TryLock(testCtx(t), name)
		if err != nil {
			t.Fatalf("the session's next lock of the name, its orphan there: %v", err)
		}
		if l.Token() <= orphan {
			t.Fatalf("token %d is the orphan's (%d), not a new key's", l.Token(), orphan)
		}
		if err := l.Unlock(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("another client's key is not taken", func(t *testing.T) {
		name := etcdtest.Name(t, "orphan-foreign")
		putOnLease(name) // as a concurrency.Mutex sharing the lease would
		if _, err := s.Lock(testCtx(t), name); !errors.Is(err, lease.ErrKeyInUse) {
			t.Fatalf("Lock over a key on the lease with no unanswered put behind it: %v, want ErrKeyInUse", err)
		}
		resp, err := cli.Get(testCtx(t), keyOf(name, s))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("the other client's key: %v, %d keys; want it untouched", err, len(resp.Kvs))
		}
	})
}
