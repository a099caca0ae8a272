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

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Tests from a cold review of the grant rule's wiring (branch core).

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

// keyOf is the queue key session s puts for name.
func keyOf(name string, s *lease.Session) string { return fmt.Sprintf("%s/%x", name, int64(s.Lease())) }

// A far waiter that has to follow a key again whose watch the session
// closed while it waited (its lock subscribed to it at its start, as a
// watch its session kept) waits quietly: the new watch of that key is a
// source of the rule like the old one. The rule knows sources by name
// ("follow <key>") and drops news of a generation below one it saw end;
// a new watch of the same key starts its epochs from 1 again.
//
// Session S's first lock L1 follows D and C (four keys ahead), and gives
// up while L2, S's next lock of the name, waits at the name's gate. L2
// starts subscribed to the watches of D and C, queues behind E and F too,
// follows those, which closes the watches of D and C, and when E and F
// give up must follow D and C again, through new watches.
func TestFarWaiterRefollowsClosedWatchQuietly(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "refollow")
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	mustLock(t, newSession(t, cli), name) // A, held throughout
	var keys []string
	for i := range 3 { // B, C, D
		s := newSession(t, cli)
		lockAsync(ctx, s, name)
		waitQueued(t, cli, name, i+2)
		keys = append(keys, keyOf(name, s))
	}
	c, d := keys[1], keys[2]
	tp := newTap()
	s := newSession(t, tapClient(t, tp))
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	l1 := lockAsync(ctx1, s, name)
	waitQueued(t, cli, name, 5)
	tp.await(etcdproc.Ctx(t, 30*time.Second), t, "L1 following D and C", func(tp *tap) bool { return tp.readAfter(d, c) })

	var gaveUp []func()
	var results []<-chan lockResult
	var ef []string
	for i := range 2 { // E, F
		se := newSession(t, cli)
		cctx, ccancel := context.WithCancel(ctx)
		defer ccancel()
		gaveUp, results = append(gaveUp, ccancel), append(results, lockAsync(cctx, se, name))
		waitQueued(t, cli, name, 6+i)
		ef = append(ef, keyOf(name, se))
	}
	l2 := lockAsync(ctx, s, name) // waits at the gate behind L1
	cancel1()
	if r := <-l1; r.err == nil {
		t.Fatal("L1 granted")
	}
	waitQueued(t, cli, name, 7) // L2 put
	tp.await(etcdproc.Ctx(t, 30*time.Second), t, "L2 following F and E", func(tp *tap) bool { return tp.readAfter(ef[1], ef[0]) })
	for i := range gaveUp {
		gaveUp[i]()
		<-results[i]
	}
	// L2 now follows D and C again, through new watches, behind a holder
	// that stays: it has nothing to read until one of them goes.
	tp.mu.Lock()
	before := len(tp.txns)
	tp.mu.Unlock()
	const busy = 300
	wctx, wcancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 3*time.Second)
	defer wcancel()
	for {
		tp.mu.Lock()
		n, moved := len(tp.txns)-before, tp.moved
		tp.mu.Unlock()
		if n >= busy {
			t.Fatalf("L2 sent %d reads while nothing ahead of it changed: it reads in a loop", n)
		}
		select {
		case <-moved:
			continue
		case r := <-l2:
			t.Fatalf("L2 returned behind a holder: err %v", r.err)
		case <-wctx.Done():
		}
		break
	}
	tp.mu.Lock()
	t.Logf("L2 sent %d reads in 3 s behind a holder that stays", len(tp.txns)-before)
	tp.mu.Unlock()
}
