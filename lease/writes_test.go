package lease_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// keyGet reads key, nil if absent.
func keyGet(t *testing.T, cli *clientv3.Client, key string) *clientv3.GetResponse {
	t.Helper()
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// expectHeldKey fails unless l's key exists with its token.
func expectHeldKey(t *testing.T, cli *clientv3.Client, l *lease.Lock, what string) {
	t.Helper()
	resp := keyGet(t, cli, l.Key())
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != l.Token() {
		t.Fatalf("%s: key %s is %v, want it created at the token %d", what, l.Key(), resp.Kvs, l.Token())
	}
	if err := l.Err(); err != nil {
		t.Fatalf("%s: the holding ended: %v", what, err)
	}
}

// A put loses its answer after etcd applied it; the withdrawal's first
// try is held back, its retry removes the key. The session locks the name
// again; then the first try applies. It must not delete the new holding's
// key (issue 46, defect 1: it did, and the next waiter was granted while
// the holder had not been told).
func TestLateWithdrawalSparesNextHolding(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	name := etcdproc.Name(t, "late-withdrawal")
	kv := &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate {
		return map[int]fate{0: loseAnswer, 1: hold}[n]
	}}
	lease.SetKeys(s, kv)
	if l, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name); err == nil {
		t.Fatalf("Lock whose put lost its answer: granted %v", l.Key())
	}
	if keys := queueKeys(t, cli, name); len(keys) != 0 {
		t.Fatalf("keys left after the withdrawal: %v", keys)
	}
	l := mustLock(t, s, name)
	if applied := kv.replay(t); applied != 0 {
		t.Errorf("the late try of the withdrawal applied")
	}
	expectHeldKey(t, cli, l, "after the late withdrawal")
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// Someone deletes a session's marker (etcdctl del --prefix over the
// library's keys, say): the session's next lock of the name is granted,
// not refused with ErrKeyInUse, and no key of its own is left blocking
// other sessions (issue 46, defect 2, and the cases a review of the fix
// found: a deletion between a put's apply and its withdrawal, and a held
// put applied between two deletions).
func TestDeletedMarkerStrandsNoName(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for _, c := range []struct {
		name  string
		first fate // the put's
		// inside deletes the marker just before the withdrawal; before
		// and after the held put's replay, deletes it then.
		inside, before, after bool
	}{
		{name: "after a withdrawal", first: loseAnswer, before: true},
		{name: "a held put applies after it", first: hold, before: true},
		{name: "between the put's apply and its withdrawal", first: loseAnswer, inside: true},
		{name: "a held put applies between two", first: hold, before: true, after: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, o := newSession(t, cli), newSession(t, cli)
			name := etcdproc.Name(t, "deleted-marker")
			del := func() {
				if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), lease.MarkerKey(s, name)); err != nil {
					t.Error(err)
				}
			}
			kv := &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate {
				if n == 1 && c.inside {
					del()
				}
				return map[int]fate{0: c.first}[n]
			}}
			lease.SetKeys(s, kv)
			if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name); err == nil {
				t.Fatal("Lock whose put lost its answer: granted")
			}
			if c.before {
				del()
			}
			if c.first == hold && kv.replay(t) != 1 {
				t.Fatal("the held put, sent after the marker's deletion, did not apply")
			}
			if c.after {
				del()
			}
			l, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
			if err != nil {
				t.Fatalf("the session's lock of the name after its marker went: %v", err)
			}
			expectHeldKey(t, cli, l, "granted")
			if keys := queueKeys(t, cli, name); len(keys) != 1 {
				t.Fatalf("keys under the name: %v, want the holding's alone", keys)
			}
			if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
			other, err := o.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
			if err != nil {
				t.Fatalf("another session's lock of the free name: %v", err)
			}
			if err := other.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A holding lost to someone's deletion of its key leaves its marker on
// the lease, until the session's next lock of the name deletes it with
// its Unlock (or the session ends): a key per name lost, not per lock.
func TestLostHoldingsMarkerGoesWithNextUnlock(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	name := etcdproc.Name(t, "marker-after-loss")
	l := mustLock(t, s, name)
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	expectDone(t, l.Done(), 5*time.Second, "lost holding")
	if n := len(keyGet(t, cli, lease.MarkerKey(s, name)).Kvs); n != 1 {
		t.Fatalf("%d markers after the loss, want the holding's", n)
	}
	l = mustLock(t, s, name)
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := len(keyGet(t, cli, lease.MarkerKey(s, name)).Kvs); n != 0 {
		t.Errorf("the marker outlived the next Unlock of the name")
	}
}

// A concurrency.Mutex built on the session's own lease takes the name
// between the session's unanswered put and its withdrawal. The
// withdrawal leaves the Mutex's key alone (issue 46, defect 4: it deleted
// it), the session's lock of the name is refused with ErrKeyInUse, and
// the held-back put never applies.
func TestWithdrawalSparesSharedLeaseKey(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	name := etcdproc.Name(t, "shared-lease-withdrawal")
	cs, err := concurrency.NewSession(cli, concurrency.WithLease(s.Lease()))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Orphan()
	m := concurrency.NewMutex(cs, name)
	kv := &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate {
		switch n {
		case 0:
			return hold
		case 1: // the withdrawal: the Mutex gets in first
			if err := m.Lock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Error(err)
			}
		}
		return pass
	}}
	lease.SetKeys(s, kv)
	if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name); err == nil {
		t.Fatal("Lock whose put had no answer: granted")
	}
	expectMutexKey := func(what string) {
		t.Helper()
		resp := keyGet(t, cli, m.Key())
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != m.Header().Revision {
			t.Fatalf("%s: the Mutex's key is %v", what, resp.Kvs)
		}
	}
	expectMutexKey("after the withdrawal")
	if kv.replay(t) != 0 {
		t.Error("the put applied after its withdrawal")
	}
	if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrKeyInUse) {
		t.Errorf("Lock over the Mutex's key on the session's lease: %v, want ErrKeyInUse", err)
	}
	expectMutexKey("after the refused Lock")
	if err := m.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	l := mustLock(t, s, name)
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// The keys of the library's own for a nested name (its marker, kept after
// an unanswered put, and its lock-delay record) block nothing under the
// parent: etcd's Mutex (etcdctl lock's code) and Election on the parent
// see no queue (issue 46, defect 3: they waited
// behind the marker for the session's life, behind the record for good).
func TestOwnKeysOutsideParentQueue(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	parent := etcdproc.Name(t, "own-keys-parent")
	child := parent + "/child"
	s := newSession(t, cli, lease.WithLockDelay(time.Second))
	kv := &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate { return map[int]fate{0: loseAnswer}[n] }}
	lease.SetKeys(s, kv)
	if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), child); err == nil {
		t.Fatal("Lock whose put lost its answer: granted")
	}
	l := mustLock(t, s, child)
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{lease.MarkerKey(s, child), lease.DelayRecordKey(child)} {
		if len(keyGet(t, cli, key).Kvs) != 1 {
			t.Fatalf("no key of the library's own at %q: the test shows nothing", key)
		}
	}
	if resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), parent+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("keys under the parent's prefix: %v, %v", resp, err)
	}

	cs, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	m := concurrency.NewMutex(cs, parent)
	if err := m.TryLock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatalf("etcd's Mutex on the parent: %v", err)
	}
	if err := m.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := concurrency.NewElection(cs, parent).Leader(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("etcd's Election on the parent names a leader: %v", err)
	}
}

// A lock-delay record in the place releases before the own-key prefix
// used is moved to DelayRecordKey and honoured, not ignored: it says a
// holding that is gone held the name, so the next holder waits out the
// delay.
func TestOldDelayRecordMoved(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "old-delay-record")
	old := name + "\x00lock-delay"
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), old, "held 3"); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, cli, lease.WithLockDelay(time.Second))
	start := time.Now()
	l := mustLock(t, s, name)
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("granted after %v: the old record's loss was not waited out", waited)
	}
	if len(keyGet(t, cli, old).Kvs) != 0 {
		t.Error("the old record is still in its old place")
	}
	resp := keyGet(t, cli, lease.DelayRecordKey(name))
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "held "+strconv.FormatInt(l.Token(), 10)+" 1s" {
		t.Errorf("record: %v, want held by the new holding", resp.Kvs)
	}
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}
