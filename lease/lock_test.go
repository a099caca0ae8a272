package lease_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func TestLockUnlock(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	name := etcdproc.Name(t, "basic")
	l := mustLock(t, s, name)

	if want := fmt.Sprintf("%s/%x", name, int64(s.Lease())); l.Key() != want {
		t.Errorf("Key() = %q, want etcd's layout %q", l.Key(), want)
	}
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), l.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lock key not in etcd: %v %v", resp, err)
	}
	if kv := resp.Kvs[0]; kv.CreateRevision != l.Token() || kv.Lease != int64(s.Lease()) {
		t.Errorf("key create revision %d lease %x, lock token %d lease %x", kv.CreateRevision, kv.Lease, l.Token(), s.Lease())
	}
	if l.Err() != nil {
		t.Errorf("Err() of a held lock = %v", l.Err())
	}
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	expectDone(t, l.Done(), time.Second, "Done after Unlock")
	if !errors.Is(l.Err(), lease.ErrUnlocked) {
		t.Errorf("Err() after Unlock = %v, want ErrUnlocked", l.Err())
	}
	if keys := queueKeys(t, cli, name); len(keys) != 0 {
		t.Errorf("keys left after Unlock: %v", keys)
	}
}

// Interoperability with etcd's own lock implementations, both directions.
func TestInteropConcurrencyMutex(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "interop")
	ours := newSession(t, cli)
	cs, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	m := concurrency.NewMutex(cs, name)

	t.Run("ours excludes Mutex", func(t *testing.T) {
		l := mustLock(t, ours, name)
		if err := m.TryLock(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, concurrency.ErrLocked) {
			t.Fatalf("Mutex.TryLock while we hold: %v, want ErrLocked", err)
		}
		got := make(chan error, 1)
		go func() { got <- m.Lock(etcdproc.Ctx(t, 30*time.Second)) }()
		waitQueued(t, cli, name, 2)
		select {
		case err := <-got:
			t.Fatalf("Mutex.Lock returned while we hold the lock: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("Mutex.Lock after our Unlock: %v", err)
		}
	})
	t.Run("Mutex excludes ours", func(t *testing.T) {
		// m holds the lock from the previous subtest.
		if _, err := ours.TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("TryLock while Mutex holds: %v, want ErrLocked", err)
		}
		ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), ours, name)
		waitQueued(t, cli, name, 2)
		expectPending(t, ch, 200*time.Millisecond)
		if err := m.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		if r.err != nil {
			t.Fatalf("Lock after Mutex.Unlock: %v", r.err)
		}
		r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	})
}

// The token is the key's creation revision even when the lock was
// contended, when concurrency.Mutex's header revision is not.
func TestTokenIsCreationRevision(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "token")
	a, b := newSession(t, cli), newSession(t, cli)
	la := mustLock(t, a, name)
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), b, name)
	waitQueued(t, cli, name, 2)
	for i := 0; i < 3; i++ { // move the store revision on while b waits
		if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), name+"-other", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := la.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	lb := r.l
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), lb.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v", lb.Key(), err)
	}
	if lb.Token() != resp.Kvs[0].CreateRevision {
		t.Errorf("token %d, creation revision %d", lb.Token(), resp.Kvs[0].CreateRevision)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("successor token %d not above predecessor's %d", lb.Token(), la.Token())
	}
	if lb.Token() >= resp.Header.Revision {
		t.Errorf("token %d should be older than the revisions written since (%d)", lb.Token(), resp.Header.Revision)
	}
	if int64(b.Lease()) == lb.Token() {
		t.Error("token equals the lease ID")
	}
	lb.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// Tokens of successive holders of one name strictly increase, whichever
// session holds it.
func TestTokensIncrease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "increase")
	sessions := []*lease.Session{newSession(t, cli), newSession(t, cli), newSession(t, cli)}
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				l, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				mu.Unlock()
				if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(tokens) != 30 {
		t.Fatalf("%d grants, want 30", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d has token %d after %d: %v", i, tokens[i], tokens[i-1], tokens)
		}
	}
}

// A waiter whose own key is deleted, or whose session's lease is revoked,
// returns at once, while the holder still holds the lock.
func TestWaiterLosesKey(t *testing.T) {
	etcdproc.LeakCheck(t)
	cases := []struct {
		name string
		kill func(t *testing.T, cli *clientv3.Client, s *lease.Session, key string)
	}{
		{"key deleted", func(t *testing.T, cli *clientv3.Client, _ *lease.Session, key string) {
			if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), key); err != nil {
				t.Fatal(err)
			}
		}},
		{"lease revoked", func(t *testing.T, cli *clientv3.Client, s *lease.Session, _ string) {
			if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcd.Client(t)
			name := etcdproc.Name(t, "waiter")
			holder, waiter := newSession(t, cli), newSession(t, cli)
			l := mustLock(t, holder, name)
			ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
			waitQueued(t, cli, name, 2)
			tc.kill(t, cli, waiter, fmt.Sprintf("%s/%x", name, int64(waiter.Lease())))
			select {
			case r := <-ch:
				if !errors.Is(r.err, lease.ErrLost) {
					t.Fatalf("waiter returned %v, %v; want an error wrapping ErrLost", r.l, r.err)
				}
			case <-time.After(time.Second):
				t.Fatal("waiter still waiting 1s after its key vanished")
			}
			if l.Err() != nil {
				t.Errorf("holder lost the lock: %v", l.Err())
			}
			l.Unlock(etcdproc.Ctx(t, 30*time.Second))
		})
	}
}

func TestCancelledWaiterRemovesKey(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "cancel")
	holder, waiter := newSession(t, cli), newSession(t, cli)
	l := mustLock(t, holder, name)
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	ch := lockAsync(ctx, waiter, name)
	waitQueued(t, cli, name, 2)
	cancel()
	r := <-ch
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Lock: %v, want context.Canceled", r.err)
	}
	if keys := queueKeys(t, cli, name); len(keys) != 1 || keys[0] != l.Key() {
		t.Fatalf("queue after cancel = %v, want only the holder's %s", keys, l.Key())
	}
	// The waiter's session can take the lock afterwards.
	l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	mustLock(t, waiter, name).Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// Two Lock calls on one name through one session exclude each other, though
// they use the same etcd key.
func TestSameSessionExclusion(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "same")
	s := newSession(t, cli)
	first := mustLock(t, s, name)
	if _, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("TryLock through the holding session: %v, want ErrLocked", err)
	}
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), s, name)
	expectPending(t, ch, 300*time.Millisecond)
	if err := first.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Token() <= first.Token() {
		t.Errorf("second holder token %d not above first's %d", r.l.Token(), first.Token())
	}
	if r.l.Err() != nil {
		t.Errorf("second holder lost: %v", r.l.Err())
	}
	r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// A TryLock that fails writes nothing at all.
func TestTryLockWritesNothingWhenHeld(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "try")
	holder, other := newSession(t, cli), newSession(t, cli)
	l := mustLock(t, holder, name)
	before, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any-key")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := other.TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("TryLock: %v, want ErrLocked", err)
		}
	}
	after, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "any-key")
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("failed TryLocks moved the store revision from %d to %d", before.Header.Revision, after.Header.Revision)
	}
	l.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// jobs and jobs/7 are different locks.
func TestNestedNames(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	parent := etcdproc.Name(t, "jobs")
	child := parent + "/7"
	a, b, c := newSession(t, cli), newSession(t, cli), newSession(t, cli)

	// An older holder and a waiter on the child lock.
	lc := mustLock(t, a, child)
	waiting := lockAsync(etcdproc.Ctx(t, 30*time.Second), b, child)
	waitQueued(t, cli, child, 2)

	lp, err := c.TryLock(etcdproc.Ctx(t, 30*time.Second), parent)
	if err != nil {
		t.Fatalf("TryLock(%q) with %q held: %v", parent, child, err)
	}
	lp.Unlock(etcdproc.Ctx(t, 30*time.Second))
	lp = mustLock(t, c, parent)
	// While the parent is held, the child lock changes hands freely.
	if err := lc.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-waiting
	if r.err != nil {
		t.Fatalf("child waiter: %v", r.err)
	}
	// A guard of the parent is unaffected by the child's keys.
	txn, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).If(clientv3.Compare(clientv3.CreateRevision(lp.Key()), "=", lp.Token())).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("parent guard failed: %v", err)
	}
	if lp.Err() != nil || r.l.Err() != nil {
		t.Fatalf("a holder lost its lock: parent %v, child %v", lp.Err(), r.l.Err())
	}
	r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	lp.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// Unlock after loss sends nothing and never removes a successor's key,
// even one with the same key name from the same session.
func TestUnlockNeverDeletesSuccessor(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "succ")
	s := newSession(t, cli)
	old := mustLock(t, s, name)
	// Someone deletes the key and a new key appears under the same name and
	// lease, as a newer lock of the same session would make.
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), old.Key()); err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), old.Key(), "", clientv3.WithLease(s.Lease()))
	if err != nil {
		t.Fatal(err)
	}
	err = old.Unlock(etcdproc.Ctx(t, 30*time.Second))
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Unlock after the key was replaced: %v, want ErrLost", err)
	}
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), old.Key())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != put.Header.Revision {
		t.Fatalf("successor key was removed or changed: %v %v", resp, err)
	}
	if err := old.Unlock(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, lease.ErrLost) {
		t.Errorf("second Unlock after loss: %v, want ErrLost", err)
	}
}

// An Unlock that finds the lock already ended returns once the lock has
// finished: the same session may take the name again at once. It raced
// the lock's finish before (a cold model run found it: TestWriteModel).
func TestRelockAfterUnlockOfLostLock(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "relock")
	s := newSession(t, cli)
	for i := range 20 {
		l := mustLock(t, s, name)
		if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
			t.Fatal(err)
		}
		// Err turns non-nil as the lock's context ends, before it finishes.
		for l.Err() == nil {
			runtime.Gosched()
		}
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, lease.ErrKeyDeleted) {
			t.Fatalf("round %d: Unlock of a lost lock: %v, want ErrKeyDeleted", i, err)
		}
		again, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
		if err != nil {
			t.Fatalf("round %d: TryLock right after Unlock of a lost lock: %v", i, err)
		}
		if err := again.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUnlockTwice(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	l := mustLock(t, s, etcdproc.Name(t, "twice"))
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, lease.ErrUnlocked) {
		t.Fatalf("second Unlock: %v, want ErrUnlocked", err)
	}
}

// Done closes and Err says why, for each way a lock can end.
func TestLossSignals(t *testing.T) {
	etcdproc.LeakCheck(t)
	cases := []struct {
		name string
		end  func(t *testing.T, cli *clientv3.Client, s *lease.Session, l *lease.Lock)
		want error
		lost bool
	}{
		{"key deleted", func(t *testing.T, cli *clientv3.Client, _ *lease.Session, l *lease.Lock) {
			cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key())
		}, lease.ErrKeyDeleted, true},
		{"key replaced", func(t *testing.T, cli *clientv3.Client, _ *lease.Session, l *lease.Lock) {
			cli.Txn(etcdproc.Ctx(t, 30*time.Second)).Then(clientv3.OpDelete(l.Key())).Commit()
			cli.Put(etcdproc.Ctx(t, 30*time.Second), l.Key(), "")
		}, lease.ErrKeyDeleted, true},
		{"lease revoked", func(t *testing.T, cli *clientv3.Client, s *lease.Session, _ *lease.Lock) {
			cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease())
		}, lease.ErrLost, true},
		{"session closed", func(t *testing.T, _ *clientv3.Client, s *lease.Session, _ *lease.Lock) {
			s.Close()
		}, lease.ErrSessionClosed, false},
		{"unlocked", func(t *testing.T, _ *clientv3.Client, _ *lease.Session, l *lease.Lock) {
			l.Unlock(etcdproc.Ctx(t, 30*time.Second))
		}, lease.ErrUnlocked, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcd.Client(t)
			s := newSession(t, cli)
			l := mustLock(t, s, etcdproc.Name(t, "loss"))
			work, cancel := l.Context(etcdproc.Ctx(t, 30*time.Second))
			defer cancel()
			tc.end(t, cli, s, l)
			expectDone(t, l.Done(), 2*time.Second, "Lock.Done")
			expectDone(t, work.Done(), time.Second, "Lock.Context")
			if !errors.Is(l.Err(), tc.want) {
				t.Errorf("Err() = %v, want %v", l.Err(), tc.want)
			}
			if errors.Is(l.Err(), lease.ErrLost) != tc.lost {
				t.Errorf("errors.Is(%v, ErrLost) = %v, want %v", l.Err(), !tc.lost, tc.lost)
			}
			if !errors.Is(context.Cause(work), l.Err()) {
				t.Errorf("context cause %v, want %v", context.Cause(work), l.Err())
			}
			if tc.lost {
				if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, lease.ErrLost) {
					t.Errorf("Unlock after loss: %v, want ErrLost", err)
				}
			}
		})
	}
}

// With the network silent, the session reports the loss at its own
// deadline, which is at least the loss margin (a twentieth of the TTL)
// ahead of etcd's deletion of the key. The deadline is what is compared:
// when Done is seen also depends on the scheduler, and is only bounded.
func TestLossWithSilentNetwork(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	s := newSession(t, viaProxy, lease.WithTTL(shortTTL))
	l := mustLock(t, s, etcdproc.Name(t, "silent"))
	deleted := watchDelete(t, cli, l)

	p.BlackholeTx()
	p.BlackholeRx()
	expectDone(t, l.Done(), 2*s.TTL(), "Lock.Done with a silent network")
	lostAt := time.Now()
	if !errors.Is(l.Err(), lease.ErrLeaseExpired) {
		t.Errorf("Err() = %v, want ErrLeaseExpired", l.Err())
	}
	checkLossAhead(t, s, lostAt, deleted)
}

// watchDelete reports when etcd deletes l's key, seen by another client.
func watchDelete(t *testing.T, cli *clientv3.Client, l *lease.Lock) <-chan time.Time {
	t.Helper()
	deleted := make(chan time.Time, 1)
	wctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	t.Cleanup(cancel)
	wch := cli.Watch(wctx, l.Key(), clientv3.WithRev(l.Token()+1))
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					deleted <- time.Now()
					return
				}
			}
		}
	}()
	return deleted
}

// checkLossAhead checks a loss seen at lostAt against s's final deadline
// and etcd's deletion of the key: the loss comes at the deadline, within
// a bound for a loaded machine (and no more than a quarter of the TTL
// before it, how early the renewer may aim for its own lateness); the
// deletion no sooner than the loss margin after the deadline, and after
// the loss was seen.
func checkLossAhead(t *testing.T, s *lease.Session, lostAt time.Time, deleted <-chan time.Time) {
	t.Helper()
	deadline := s.Deadline()
	// The renewer ends a session early by its timer's recent lateness, at
	// most a quarter of the TTL; a little slack for a lateness measured
	// since.
	if early, most := deadline.Sub(lostAt), min(lease.SchedLag(s)+50*time.Millisecond, s.TTL()/4); early > most {
		t.Errorf("loss reported %v before the deadline %v, want at most %v (the renewer's lag, capped)", early, deadline, most)
	}
	// A bound for a loaded machine: it catches a renewer that checks
	// deadlines on a tick of a second, not one a little late.
	if late := lostAt.Sub(deadline); late > s.TTL()/4 {
		t.Errorf("loss reported %v after the deadline, want within %v", late, s.TTL()/4)
	}
	select {
	case at := <-deleted:
		if ahead, margin := at.Sub(deadline), s.TTL()/20; ahead < margin {
			t.Errorf("etcd deleted the key %v after the local deadline, want at least the margin %v", ahead, margin)
		}
		if !lostAt.Before(at) {
			t.Errorf("etcd deleted the key at %v, before the local loss was seen at %v", at, lostAt)
		}
		t.Logf("local deadline %v before etcd's deletion; loss seen %v before it", at.Sub(deadline), at.Sub(lostAt))
	case <-time.After(3 * s.TTL()):
		t.Fatal("etcd never expired the lease")
	}
}

// A waiter whose watches resume at a compacted revision looks again, and is
// never granted the lock while its predecessor still holds it.
func TestWaiterSurvivesCompaction(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	target := etcd.Endpoints()[0]
	p, viaProxy, url := etcdproc.ProxiedClient(t, target)
	name := etcdproc.Name(t, "compact")
	holder := newSession(t, cli)
	waiter := newSession(t, viaProxy, lease.WithTTL(10*time.Second))
	l := mustLock(t, holder, name)
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
	waitQueued(t, cli, name, 2)

	// Still waiting: and by now the answer to its queueing put has
	// arrived, so the cut below hits the wait, not the put.
	expectPending(t, ch, 200*time.Millisecond)
	// Cut the waiter off, move the store on and compact it, then let the
	// waiter's client reconnect: its watches resume at a compacted revision.
	addr := strings.TrimPrefix(url, "http://")
	p.Close()
	var last int64
	for i := 0; i < 5; i++ {
		r, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), name+"-noise", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		last = r.Header.Revision
	}
	if _, err := cli.Compact(etcdproc.Ctx(t, 30*time.Second), last); err != nil {
		t.Fatal(err)
	}
	etcdproc.ProxyAt(t, addr, target)
	// Cleanups run last first: the client must go before the new proxy,
	// whose Close waits for the client's connection to end.
	t.Cleanup(func() { waiter.Close(); viaProxy.Close() })
	if _, err := viaProxy.Get(etcdproc.Ctx(t, 30*time.Second), name); err != nil {
		t.Fatalf("waiter's client did not reconnect: %v", err)
	}
	expectPending(t, ch, 500*time.Millisecond)
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("waiter after compaction: %v", r.err)
		}
		if r.l.Token() <= l.Token() {
			t.Errorf("token %d not above %d", r.l.Token(), l.Token())
		}
		r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not granted 5s after the holder left")
	}
}

// A Lock whose ctx ends while its key is being written leaves no key
// behind: the write's outcome is awaited and the key removed, where a
// write cut off by ctx could be applied after the cleanup and sit in the
// queue, owned by no lock, for as long as the session lives (every other
// contender waiting behind it). Timeouts from 0.1 to 2 ms end the calls at
// every point of the enqueue.
func TestGivenUpLockLeavesNoKey(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "given-up")
	holder := mustLock(t, newSession(t, cli), name)
	s := newSession(t, cli)
	key := fmt.Sprintf("%s/%x", name, int64(s.Lease()))
	gaveUp := 0
	for i := 0; i < 300; i++ {
		ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), time.Duration(100+(i*97)%1900)*time.Microsecond)
		_, err := s.Lock(ctx, name)
		cancel()
		if err == nil {
			t.Fatal("granted while another session holds the lock")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %v, want the caller's deadline", i, err)
		}
		gaveUp++
		if resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), key); err != nil || len(resp.Kvs) != 0 {
			t.Fatalf("call %d: the session's key is left behind (%v, %v)", i, resp.Kvs, err)
		}
	}
	mustUnlock(t, holder)
	l := mustLock(t, s, name) // nothing of the given-up calls is in the way
	mustUnlock(t, l)
}

// A lock taken and released again and again, held briefly each time, opens
// no watch and is sent none of its own deletions (after its two requests,
// the largest cost of an uncontended lock). Held for longer, it opens the
// watch of its key, and a deletion of the key by someone else ends it.
func TestBriefLockOpensNoWatch(t *testing.T) {
	etcdproc.LeakCheck(t)
	name := etcdproc.Name(t, "brief")
	counts := &readerDeletes{keys: map[string]bool{}, created: make(chan struct{}, 16)}
	cli := counts.client(t)
	s := newSession(t, cli)
	counts.keys[fmt.Sprintf("%s/%x", name, int64(s.Lease()))] = true
	var slowest time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		mustUnlock(t, mustLock(t, s, name))
		slowest = max(slowest, time.Since(start))
	}
	select {
	case <-counts.created:
		if slowest < 25*time.Millisecond {
			t.Errorf("brief locks (the slowest %v) opened a watch", slowest)
		}
	default:
	}
	if n := counts.deletes.Load(); n != 0 && slowest < 25*time.Millisecond {
		t.Errorf("brief locks (the slowest %v) were sent %d of their own deletions, want 0", slowest, n)
	}
	held := mustLock(t, s, name)
	select {
	case <-counts.created:
	case <-etcdproc.Ctx(t, 30*time.Second).Done():
		t.Fatal("a lock held for long opened no watch of its key")
	}
	if _, err := etcd.Client(t).Delete(etcdproc.Ctx(t, 30*time.Second), held.Key()); err != nil {
		t.Fatal(err)
	}
	expectDone(t, held.Done(), 2*time.Second, "Lock.Done after its key's deletion")
	if !errors.Is(held.Err(), lease.ErrKeyDeleted) {
		t.Errorf("Err() = %v, want ErrKeyDeleted", held.Err())
	}
}

// A waiter whose key is deleted just before the key ahead of it, or in the
// same transaction, is never told it holds the lock: the deletion that
// empties its view comes through the queue watch, and its own key's
// through the own-key watch, whose events the client may hand over later.
// (CI caught a waiter granted in that order, token 55 while the key ahead,
// 52, was gone.)
func TestWaiterKeyDeletedBeforeHeadLeaves(t *testing.T) {
	etcdproc.LeakCheck(t)
	cases := []struct {
		name string
		del  func(ctx context.Context, cli *clientv3.Client, waiter, head string) error
	}{
		{"one after the other", func(ctx context.Context, cli *clientv3.Client, waiter, head string) error {
			if _, err := cli.Delete(ctx, waiter); err != nil {
				return err
			}
			_, err := cli.Delete(ctx, head)
			return err
		}},
		{"in one transaction", func(ctx context.Context, cli *clientv3.Client, waiter, head string) error {
			_, err := cli.Txn(ctx).Then(clientv3.OpDelete(waiter), clientv3.OpDelete(head)).Commit()
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcd.Client(t)
			counts := &readerDeletes{keys: map[string]bool{}, created: make(chan struct{}, 16)}
			hs, ws := newSession(t, cli), newSession(t, counts.client(t))
			for i := 0; i < 20; i++ {
				name := etcdproc.Name(t, fmt.Sprintf("deleted-waiter-%d", i))
				head := mustLock(t, hs, name)
				ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), ws, name)
				// The waiter follows the queue once both its watches are
				// up: the case where the two deletions race.
				for up := 0; up < 2; up++ {
					select {
					case <-counts.created:
					case <-etcdproc.Ctx(t, 30*time.Second).Done():
						t.Fatal("the waiter's watches never came up")
					}
				}
				waiterKey := fmt.Sprintf("%s/%x", name, int64(ws.Lease()))
				if err := tc.del(etcdproc.Ctx(t, 30*time.Second), cli, waiterKey, head.Key()); err != nil {
					t.Fatal(err)
				}
				select {
				case r := <-ch:
					if r.err == nil {
						r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
						t.Fatalf("round %d: waiter granted with token %d after its key was deleted", i, r.l.Token())
					}
					if !errors.Is(r.err, lease.ErrKeyDeleted) {
						t.Fatalf("round %d: waiter returned %v, want ErrKeyDeleted", i, r.err)
					}
				case <-time.After(2 * time.Second):
					t.Fatalf("round %d: waiter still waiting 2s after its key was deleted", i)
				}
				head.Unlock(etcdproc.Ctx(t, 30*time.Second))
			}
		})
	}
}

// A TryLock that finds the lock held only after nested locks' keys hid
// the queue from its first read (so it queued, and then looked) reports
// ErrLocked without opening a watch of its own key first, and leaves no
// key behind.
func TestTryLockBehindNestedKeysOpensNoWatch(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "try-nested")
	// More nested holders than one page of the oldest keys, then the
	// holder of name itself.
	for i := 0; i < 20; i++ {
		mustLock(t, newSession(t, cli), fmt.Sprintf("%s/sub%d", name, i))
	}
	holder := mustLock(t, newSession(t, cli), name)
	counts := &readerDeletes{keys: map[string]bool{}, created: make(chan struct{}, 16)}
	s := newSession(t, counts.client(t))
	_, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
	if !errors.Is(err, lease.ErrLocked) || !strings.Contains(err.Error(), holder.Key()) {
		t.Fatalf("TryLock behind nested keys: %v, want ErrLocked naming %s", err, holder.Key())
	}
	select {
	case <-counts.created:
		t.Error("a TryLock that found the lock held opened a watch")
	default:
	}
	if keys := queueKeys(t, cli, name); len(keys) != 1 {
		t.Errorf("keys queued under the name after the TryLock: %v, want the holder's alone", keys)
	}
}
