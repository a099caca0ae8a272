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

	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// Tests from a cold review of the grant rule's wiring (branch core).

// putOf picks a watch response that carries a put of key.
func putOf(key string) func(*pb.WatchResponse) bool {
	return func(wr *pb.WatchResponse) bool {
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.PUT && string(ev.Kv.Key) == key {
				return true
			}
		}
		return false
	}
}

// A near waiter whose key someone else moves off its lease (etcdctl put on
// the lock key) in the transaction that deletes the holder's key is never
// told it holds the lock. The queue watch that delivers the deletion
// leaves puts out; the own-key watch, which carries the put, delivers it
// in no fixed order with the queue watch: here, after.
func TestNearWaiterNotGrantedAfterForeignPut(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			name := etcdtest.Name(t, "near-foreign-put")
			ctx, cancel := context.WithCancel(testCtx(t))
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
			tp.await(testCtx(t), t, "the waiter's view read under both watches", func(tp *tap) bool {
				return tp.readAfter(own, name+"/")
			})
			if _, err := cli.Txn(testCtx(t)).Then(clientv3.OpPut(own, "x"), clientv3.OpDelete(holder.Key())).Commit(); err != nil {
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
