package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

func newKeeper(t *testing.T, cli *clientv3.Client) *lease.Keeper {
	t.Helper()
	k, err := lease.NewKeeper(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// Sessions renewed through one Keeper stay alive past several TTLs, each
// with its lock, over one keep-alive stream; revoking one lease ends that
// session alone.
func TestKeeperRenewsManySessions(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	name := etcdtest.Name(t, "keeper")
	const n = 20
	var sessions []*lease.Session
	var locks []*lease.Lock
	for i := 0; i < n; i++ {
		s := newSession(t, cli, lease.WithTTL(shortTTL), lease.WithKeeper(k))
		sessions = append(sessions, s)
		locks = append(locks, mustLock(t, s, fmt.Sprintf("%s/%d", name, i)))
	}
	select {
	case <-locks[0].Done():
		t.Fatalf("lock lost while the Keeper should renew it: %v", locks[0].Err())
	case <-time.After(2 * sessions[0].TTL()):
	}
	for i, s := range sessions {
		ttl, err := cli.TimeToLive(testCtx(t), s.Lease())
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("session %d: lease not alive after 2×TTL: %v %v", i, ttl, err)
		}
		if !s.Deadline().After(time.Now()) {
			t.Errorf("session %d: deadline %v in the past", i, s.Deadline())
		}
	}
	if _, err := cli.Revoke(testCtx(t), sessions[3].Lease()); err != nil {
		t.Fatal(err)
	}
	expectDone(t, locks[3].Done(), 2*time.Second, "the revoked session's lock")
	if !errors.Is(locks[3].Err(), lease.ErrLost) {
		t.Errorf("revoked: Err() = %v, want ErrLost", locks[3].Err())
	}
	for i, l := range locks {
		if i != 3 && l.Err() != nil {
			t.Errorf("lock %d ended with another session's revoke: %v", i, l.Err())
		}
	}
}

// With the network silent, every session of a Keeper reports its loss
// from its own conservative deadline, before etcd expires its lease.
func TestKeeperLossWithSilentNetwork(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	p, viaProxy, _ := etcdtest.ProxiedClient(t, etcd.Endpoints()[0])
	k := newKeeper(t, viaProxy)
	const n = 3
	var locks []*lease.Lock
	for i := 0; i < n; i++ {
		s := newSession(t, viaProxy, lease.WithTTL(shortTTL), lease.WithKeeper(k))
		locks = append(locks, mustLock(t, s, etcdtest.Name(t, "keeper-silent")))
	}
	wctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	deleted := make([]chan time.Time, n)
	lost := make([]chan time.Time, n)
	for i, l := range locks {
		deleted[i], lost[i] = make(chan time.Time, 1), make(chan time.Time, 1)
		wch := cli.Watch(wctx, l.Key(), clientv3.WithRev(l.Token()+1))
		go func() {
			for wr := range wch {
				for _, ev := range wr.Events {
					if ev.Type == mvccpb.DELETE {
						deleted[i] <- time.Now()
						return
					}
				}
			}
		}()
		go func() {
			<-l.Done()
			lost[i] <- time.Now()
		}()
	}
	p.BlackholeTx()
	p.BlackholeRx()
	for i, l := range locks {
		var at time.Time
		select {
		case at = <-lost[i]:
		case <-time.After(2 * shortTTL):
			t.Fatalf("lock %d: no local loss with a silent network", i)
		}
		if !errors.Is(l.Err(), lease.ErrLeaseExpired) {
			t.Errorf("lock %d: Err() = %v, want ErrLeaseExpired", i, l.Err())
		}
		select {
		case del := <-deleted[i]:
			if del.Before(at) {
				t.Errorf("lock %d: etcd deleted its key at %v, before the local loss at %v", i, del, at)
			}
		case <-time.After(3 * shortTTL):
			t.Fatalf("lock %d: etcd never expired the lease", i)
		}
	}
}

// Bad input is refused before anything is sent; Close closes the sessions
// still renewed through the Keeper.
func TestKeeperInputAndClose(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli, other := etcd.Client(t), etcd.Client(t)
	if _, err := lease.NewKeeper(nil); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("NewKeeper(nil): %v", err)
	}
	if _, err := lease.NewSession(testCtx(t), cli, lease.WithKeeper(nil)); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("WithKeeper(nil): %v", err)
	}
	k, err := lease.NewKeeper(cli)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.NewSession(testCtx(t), other, lease.WithKeeper(k)); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("a Keeper of another client: %v", err)
	}
	s, err := lease.NewSession(testCtx(t), cli, lease.WithKeeper(k))
	if err != nil {
		t.Fatal(err)
	}
	l := mustLock(t, s, etcdtest.Name(t, "keeper-close"))
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	expectDone(t, l.Done(), time.Second, "a lock of a session whose Keeper closed")
	if !errors.Is(l.Err(), lease.ErrSessionClosed) {
		t.Errorf("Err() = %v, want ErrSessionClosed", l.Err())
	}
	if _, err := lease.NewSession(testCtx(t), cli, lease.WithKeeper(k)); !errors.Is(err, lease.ErrSessionClosed) {
		t.Errorf("NewSession with a closed Keeper: %v", err)
	}
	if err := k.Close(); !errors.Is(err, lease.ErrSessionClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// Sessions of one Keeper share a name's queue watch: they still take the
// lock one at a time, in token order, and a waiter still sees its own key
// vanish at once.
func TestKeeperSharedQueue(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	name := etcdtest.Name(t, "keeper-queue")
	const sessions, rounds = 8, 15
	var mu sync.Mutex
	holding, last := 0, int64(0)
	var wg sync.WaitGroup
	for i := 0; i < sessions; i++ {
		s := newSession(t, cli, lease.WithKeeper(k))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				l, err := s.Lock(testCtx(t), name)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				holding++
				if holding != 1 || l.Token() <= last {
					t.Errorf("%d holders at once, token %d after %d", holding, l.Token(), last)
				}
				last = l.Token()
				mu.Unlock()
				mu.Lock()
				holding--
				mu.Unlock()
				if err := l.Unlock(testCtx(t)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()

	holder := mustLock(t, newSession(t, cli, lease.WithKeeper(k)), name)
	queued := make(chan struct{}, 1)
	hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
		if delta > 0 {
			queued <- struct{}{}
		}
	}}
	waiter := newSession(t, cli, lease.WithKeeper(k), lease.WithHooks(hooks))
	res := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(testCtx(t), name)
		res <- err
	}()
	<-queued // its key is put and it waits
	key := name + "/" + fmt.Sprintf("%x", int64(waiter.Lease()))
	if _, err := cli.Delete(testCtx(t), key); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, lease.ErrKeyDeleted) {
			t.Errorf("waiter whose key vanished: %v, want ErrKeyDeleted", err)
		}
	case <-time.After(time.Second):
		t.Fatal("waiter still waiting 1s after its key vanished")
	}
	if holder.Err() != nil {
		t.Errorf("holder ended: %v", holder.Err())
	}
}

// queueReads counts the reads of a lock name's queue in the order of
// creation (the reads a lock makes of the keys ahead of it), in every
// request the client sends, nested transactions included.
type queueReads struct {
	prefix   string
	n        atomic.Int64 // full reads, sorted by creation
	keysOnly atomic.Int64 // keys-only reads of the keys older than a revision
}

func (q *queueReads) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch r := req.(type) {
	case *pb.RangeRequest:
		q.count(r)
	case *pb.TxnRequest:
		q.countTxn(r)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (q *queueReads) countTxn(t *pb.TxnRequest) {
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			if r := op.GetRequestRange(); r != nil {
				q.count(r)
			}
			if nested := op.GetRequestTxn(); nested != nil {
				q.countTxn(nested)
			}
		}
	}
}

func (q *queueReads) count(r *pb.RangeRequest) {
	switch {
	case string(r.Key) != q.prefix:
	case r.KeysOnly && r.MaxCreateRevision != 0:
		q.keysOnly.Add(1)
	case r.SortTarget == pb.RangeRequest_CREATE:
		q.n.Add(1)
	}
}

// A waiter queued through a Keeper takes its view of the queue from the
// Keeper's copy, kept by the shared watch: its enqueue is a put alone and
// it is granted with no read, however many wait ahead of it. Through
// sessions of their own, each waiter reads the queue in full as it
// queues; one far back, once the key just ahead is gone, confirms that
// nothing older is left with a keys-only read (served from etcd's index on
// 3.7) rather than a second full read.
func TestQueueReads(t *testing.T) {
	etcdtest.LeakCheck(t)
	for _, keeper := range []bool{true, false} {
		t.Run(fmt.Sprintf("keeper=%v", keeper), func(t *testing.T) {
			name := etcdtest.Name(t, "keeper-mirror")
			reads := &queueReads{prefix: name + "/"}
			cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(reads.interceptor)}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			var opts []lease.Option
			if keeper {
				opts = append(opts, lease.WithKeeper(newKeeper(t, cli)))
			}
			const waiters = 12
			queued := make(chan struct{}, waiters)
			hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
				if delta > 0 {
					queued <- struct{}{}
				}
			}}
			holder := mustLock(t, newSession(t, cli, opts...), name)
			before, keysOnlyBefore := reads.n.Load(), reads.keysOnly.Load()
			granted := make(chan *lease.Lock, waiters)
			errs := make(chan error, waiters)
			for i := 0; i < waiters; i++ {
				s := newSession(t, cli, append(opts, lease.WithHooks(hooks))...)
				go func() {
					l, err := s.Lock(testCtx(t), name)
					if err != nil {
						errs <- err
						return
					}
					granted <- l
				}()
				<-queued // one at a time, so that the queue order is known
			}
			if err := holder.Unlock(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			last := holder.Token()
			for i := 0; i < waiters; i++ {
				select {
				case l := <-granted:
					if l.Token() <= last {
						t.Errorf("granted token %d after %d", l.Token(), last)
					}
					last = l.Token()
					if err := l.Unlock(testCtx(t)); err != nil {
						t.Fatal(err)
					}
				case err := <-errs:
					t.Fatal(err)
				case <-testCtx(t).Done():
					t.Fatal("a waiter was not granted")
				}
			}
			got, keysOnly := reads.n.Load()-before, reads.keysOnly.Load()-keysOnlyBefore
			// The waiters queued within reach of the head follow the queue
			// watch, and read once more as they start following it.
			const nearHead = 4
			switch {
			case keeper && got+keysOnly != 0:
				t.Errorf("%d full and %d keys-only reads of the queue by %d waiters through a Keeper, want none", got, keysOnly, waiters)
			case !keeper && (got < waiters || got > waiters+nearHead):
				t.Errorf("%d full reads of the queue by %d waiters on sessions of their own, want one each (and one more near the head)", got, waiters)
			case !keeper && keysOnly < waiters-nearHead:
				t.Errorf("%d keys-only reads by %d waiters on sessions of their own, want one by each waiter far back", keysOnly, waiters)
			}
			t.Logf("%d waiters: %d full reads of the queue, %d keys-only", waiters, got, keysOnly)
		})
	}
}
