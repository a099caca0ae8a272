package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A Keeper's copy of a queue (queueMirror) stays bounded, and comes back
// once a name is below its limit again: two bugs an outside review found.

// Waiters that queue through a Keeper behind a holder that stays, and give
// up, leave nothing behind in the Keeper's copy of the queue: its order
// lists stay within a small multiple of the live keys however many came
// and went. They used to keep an entry for every waiter that ever queued
// behind a live head (2,001 entries for one live key here).
func TestMirrorBoundedBehindLiveHead(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	name := etcdproc.Name(t, "mirror-bounded")
	holder := mustLock(t, newSession(t, cli, lease.WithKeeper(k)), name)
	const sessions, rounds = 50, 40 // 2,000 waiters, 50 at a time
	waiters := make([]*lease.Session, sessions)
	queued := make([]chan struct{}, sessions)
	for i := range waiters {
		queued[i] = make(chan struct{}, 1)
		hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
			if delta > 0 {
				queued[i] <- struct{}{}
			}
		}}
		waiters[i] = newSession(t, cli, lease.WithKeeper(k), lease.WithHooks(hooks))
	}
	// At most sessions+1 keys are ever live at once.
	const most = 4 * (sessions + 1)
	for r := range rounds {
		var wg sync.WaitGroup
		for i, s := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				queueAndGiveUp(t, s, name, queued[i])
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		at := markApplied(t, cli, name)
		st, err := lease.AwaitKeeperMirror(etcdproc.Ctx(t, 30*time.Second), k, name, func(st lease.KeeperMirrorState) bool {
			return st.Valid && st.Rev >= at
		})
		if err != nil {
			t.Fatal(err)
		}
		if st.Keys != 1 {
			t.Fatalf("round %d: the copy has %d keys, want only the holder's", r, st.Keys)
		}
		if st.Queue > most || st.Writers > most || st.QueueCap > 2*most {
			t.Fatalf("after %d waiters came and went behind the holder, the copy's order lists hold %d and %d entries (capacity %d) for 1 live key, want at most %d",
				(r+1)*sessions, st.Queue, st.Writers, st.QueueCap, most)
		}
	}
	if err := holder.Err(); err != nil {
		t.Fatalf("the holder ended: %v", err)
	}
	mustUnlock(t, holder)
}

// queueAndGiveUp queues a lock of name on s behind its holder, and cancels
// it once it waits: its key is removed before Lock returns.
func queueAndGiveUp(t *testing.T, s *lease.Session, name string, queued <-chan struct{}) {
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	res := lockAsync(ctx, s, name)
	select {
	case <-queued:
	case r := <-res:
		t.Errorf("a waiter behind the holder returned: lock %v, err %v", r.l, r.err)
		return
	}
	cancel()
	if r := <-res; !errors.Is(r.err, context.Canceled) {
		t.Errorf("a waiter that gave up: lock %v, err %v, want context.Canceled", r.l, r.err)
	}
}

// markApplied puts and deletes a data key under name, and returns the
// deletion's revision: once a copy has applied it, it has applied every
// change under the name made before markApplied was called.
func markApplied(t *testing.T, cli *clientv3.Client, name string) int64 {
	t.Helper()
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), name+"/mark", ""); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), name+"/mark")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// A name that had more keys under it than a Keeper's copy keeps gets its
// copy back, from the same watch, once they are gone: the copy counts the
// keys while it is off, stays off until they are down to half the limit,
// and reads them again then. A waiter queued after that waits on the copy:
// it reads nothing, and is granted without a read. The copy used to stay
// off until the watch happened to restart. Both ways the copy goes off:
// keys added while it is on, and a name already over the limit when the
// watch comes up.
func TestMirrorBackBelowLimit(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, atLoad := range []bool{false, true} {
		t.Run(fmt.Sprintf("over-at-load=%v", atLoad), func(t *testing.T) {
			mirrorBackBelowLimit(t, atLoad)
		})
	}
}

func mirrorBackBelowLimit(t *testing.T, atLoad bool) {
	name := etcdproc.Name(t, "mirror-back")
	reads, cli := countingClient(t, name)
	k := newKeeper(t, cli)
	const data = lease.KeeperMirrorLimit + 1 // with the holder's, two keys over the limit
	if atLoad {
		putData(t, cli, name, data)
	}
	holder := mustLock(t, newSession(t, cli, lease.WithKeeper(k)), name)
	applied := holder.Token()
	if !atLoad {
		awaitMirror(t, k, name, "on", func(st lease.KeeperMirrorState) bool { return st.Valid && st.Rev >= applied })
		applied = putData(t, cli, name, data)
	}
	off := awaitMirror(t, k, name, "off", func(st lease.KeeperMirrorState) bool { return st.Counting && st.Rev >= applied })
	if off.Valid || off.Count != data+1 {
		t.Errorf("over the limit: copy %+v, want off, counting %d keys", off, data+1)
	}
	// Down to one key more than half the limit: still off.
	keep := lease.KeeperMirrorResume + 1
	at := deleteData(t, cli, name, 0, data+1-keep)
	st := awaitMirror(t, k, name, "counted", func(st lease.KeeperMirrorState) bool { return st.Rev >= at })
	if !st.Counting || st.Valid || st.Count != keep {
		t.Errorf("%d keys left: copy %+v, want still off, counting %d", keep, st, keep)
	}
	// One fewer: the copy is read again, in the same watch epoch.
	at = deleteData(t, cli, name, data+1-keep, data+2-keep)
	back := awaitMirror(t, k, name, "back", func(st lease.KeeperMirrorState) bool { return st.Valid })
	if back.Rev < at || back.Keys != keep-1 || back.Counting {
		t.Errorf("back: copy %+v, want %d keys at revision %d or later", back, keep-1, at)
	}
	if back.WatchEpoch != off.WatchEpoch || back.Epoch != off.Epoch {
		t.Errorf("the copy came back with the watch restarted: epoch %d (watch %d), was %d (watch %d)",
			back.Epoch, back.WatchEpoch, off.Epoch, off.WatchEpoch)
	}
	waitOnCopy(t, cli, k, name, holder, reads)
	deleteData(t, cli, name, 0, data)
}

// awaitMirror waits, for up to 10 s (the copy moves within milliseconds),
// until cond holds for k's copy of name's queue, and returns its state.
func awaitMirror(t *testing.T, k *lease.Keeper, name, what string, cond func(lease.KeeperMirrorState) bool) lease.KeeperMirrorState {
	t.Helper()
	st, err := lease.AwaitKeeperMirror(etcdproc.Ctx(t, 10*time.Second), k, name, cond)
	if err != nil {
		t.Fatalf("the copy never got %s: %v", what, err)
	}
	return st
}

// waitOnCopy queues a waiter behind holder through k, and checks that it
// waits on the Keeper's copy: it reads nothing of the queue as it queues
// or as holder's release grants it.
func waitOnCopy(t *testing.T, cli *clientv3.Client, k *lease.Keeper, name string, holder *lease.Lock, reads *queueReads) {
	t.Helper()
	queued := make(chan struct{}, 1)
	hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
		if delta > 0 {
			queued <- struct{}{}
		}
	}}
	s := newSession(t, cli, lease.WithKeeper(k), lease.WithHooks(hooks))
	before := reads.n.Load() + reads.keysOnly.Load() + reads.enqueues.Load()
	res := lockAsync(etcdproc.Ctx(t, 30*time.Second), s, name)
	select {
	case <-queued:
	case r := <-res:
		t.Fatalf("a waiter behind the holder returned: lock %v, err %v", r.l, r.err)
	}
	mustUnlock(t, holder)
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Token() <= holder.Token() {
		t.Errorf("granted token %d after %d", r.l.Token(), holder.Token())
	}
	if got := reads.n.Load() + reads.keysOnly.Load() + reads.enqueues.Load() - before; got != 0 {
		t.Errorf("a waiter through the Keeper read the queue %d times: it did not wait on the copy", got)
	}
	mustUnlock(t, r.l)
}

// dataKey is the i-th data key kept under name: not a queue key, but a
// key the copy holds.
func dataKey(name string, i int) string { return fmt.Sprintf("%s/data-%05d", name, i) }

// putData puts n data keys under name, 100 to a transaction (etcd takes
// at most 128 operations in one), and returns the last one's revision.
func putData(t *testing.T, cli *clientv3.Client, name string, n int) int64 {
	t.Helper()
	var rev int64
	for from := 0; from < n; from += 100 {
		var ops []clientv3.Op
		for i := from; i < min(from+100, n); i++ {
			ops = append(ops, clientv3.OpPut(dataKey(name, i), "kept under the name"))
		}
		resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	return rev
}

// deleteData deletes data keys from to to (not included) under name, in
// one deletion, and returns its revision.
func deleteData(t *testing.T, cli *clientv3.Client, name string, from, to int) int64 {
	t.Helper()
	resp, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), dataKey(name, from), clientv3.WithRange(dataKey(name, to)))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}
