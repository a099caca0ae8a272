package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Someone else's write to a lock's own key: a delete, or a put that moves
// it off its lease (etcdctl put on the lock key). A waiter whose key went
// is never told it holds the lock, and a holding ends. Each case was a bug
// that an outside review of the waiting core found.

// putOf picks a watch response of the watch of key alone that carries a
// put of it: the own-key watch's, not the queue watch's, which carries
// the holder's deletion in the same response.
func putOf(key string) func(*pb.WatchResponse) bool {
	return func(wr *pb.WatchResponse) bool {
		put := false
		for _, ev := range wr.Events {
			if string(ev.Kv.Key) != key {
				return false
			}
			put = put || ev.Type == mvccpb.PUT
		}
		return put
	}
}

// A near waiter whose key someone else moves off its lease (etcdctl put on
// the lock key) in the transaction that deletes the holder's key is never
// told it holds the lock. The own-key watch delivers the put in no fixed
// order with the queue watch's deletion: here, after. (When the queue
// watch left puts out, the waiter was told it holds in 4 of 4 rounds.)
func TestNearWaiterNotGrantedAfterForeignPut(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			name := etcdproc.Name(t, "near-foreign-put")
			ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
			defer cancel()
			holder := mustLock(t, newSession(t, cli), name)
			tp := newTap()
			ws := newSession(t, tapClient(t, tp))
			own := fmt.Sprintf("%s/%x", name, int64(ws.Lease()))
			tp.mu.Lock()
			tp.hold = putOf(own)
			tp.mu.Unlock()
			defer tp.release()
			wch := lockAsync(ctx, ws, name)
			// Waiting: its own-key watch and queue watch are up, and it
			// read its view after both came up.
			tp.await(etcdproc.Ctx(t, 30*time.Second), t, "the waiter's view read under both watches", func(tp *tap) bool {
				return tp.readAfter(own, name+"/")
			})
			if _, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).Then(clientv3.OpPut(own, "x"), clientv3.OpDelete(holder.Key())).Commit(); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-wch:
				if r.err == nil {
					t.Fatalf("the waiter was told it holds the lock, its key off its lease since the holder left (token %d)", r.l.Token())
				}
				if !errors.Is(r.err, lease.ErrKeyDeleted) {
					t.Fatalf("the waiter: err %v, want ErrKeyDeleted", r.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter did not return")
			}
		})
	}
}

// A far waiter (more than three keys ahead) whose own key goes in the same
// transaction as the last key ahead is never told it holds the lock; the
// waiter behind it is, and only it.
func TestFarWaiterNotGrantedAfterOwnKeyWent(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for round := range 8 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			name := etcdproc.Name(t, "far-own")
			ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
			defer cancel()
			var ahead []string
			for i := range 5 {
				s := newSession(t, cli)
				if i == 0 {
					ahead = append(ahead, mustLock(t, s, name).Key())
					continue
				}
				lockAsync(ctx, s, name)
				waitQueued(t, cli, name, i+1)
				ahead = append(ahead, fmt.Sprintf("%s/%x", name, int64(s.Lease())))
			}
			w := newSession(t, cli)
			wch := lockAsync(ctx, w, name)
			waitQueued(t, cli, name, 6)
			behind := lockAsync(ctx, newSession(t, cli), name)
			waitQueued(t, cli, name, 7)
			for _, key := range ahead[:4] {
				if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), key); err != nil {
					t.Fatal(err)
				}
			}
			own := fmt.Sprintf("%s/%x", name, int64(w.Lease()))
			if _, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).Then(clientv3.OpDelete(ahead[4]), clientv3.OpDelete(own)).Commit(); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-wch:
				if r.err == nil || !errors.Is(r.err, lease.ErrLost) {
					t.Fatalf("the waiter whose key went: err %v, want ErrLost (granted: %t)", r.err, r.l != nil)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter whose key went did not return")
			}
			select {
			case r := <-behind:
				if r.err != nil {
					t.Fatalf("the waiter behind: %v", r.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter behind was not granted")
			}
		})
	}
}

// A put by someone else that drops the holder's lease (etcdctl put on the
// lock key) ends the holding, and Held refuses the key, on a session of
// its own and through a Keeper.
func TestForeignPutEndsHolding(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, keeper := range []bool{false, true} {
		t.Run(map[bool]string{false: "own", true: "keeper"}[keeper], func(t *testing.T) {
			cli := etcd.Client(t)
			var opts []lease.Option
			if keeper {
				opts = append(opts, lease.WithKeeper(newKeeper(t, cli)))
			}
			name := etcdproc.Name(t, "foreign-put")
			l := mustLock(t, newSession(t, cli, opts...), name)
			if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), l.Key(), "x"); err != nil {
				t.Fatal(err)
			}
			expectDone(t, l.Done(), 10*time.Second, "holder after a foreign put")
			if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
				t.Fatalf("Err = %v, want ErrKeyDeleted", l.Err())
			}
			// etcd's own check: a holder that does not know it ended.
			_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(bare{l})).Then(clientv3.OpPut(name+"-data", "late")).Commit()
			var nh *fence.NotHeldError
			if !errors.As(err, &nh) || !nh.Detached {
				t.Fatalf("Held on a detached key: %v, want a NotHeldError saying it is detached", err)
			}
		})
	}
}

// bare is a Holder that does not say when it ended: only etcd decides.
type bare struct{ l *lease.Lock }

func (b bare) Name() string { return b.l.Name() }
func (b bare) Key() string  { return b.l.Key() }
func (b bare) Token() int64 { return b.l.Token() }
