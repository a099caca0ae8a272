package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func rlockAsync(ctx context.Context, s *lease.Session, name string) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := s.RLock(ctx, name)
		ch <- lockResult{l, err}
	}()
	return ch
}

func mustRLock(t *testing.T, s *lease.Session, name string) *lease.Lock {
	t.Helper()
	l, err := s.RLock(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatalf("RLock(%q): %v", name, err)
	}
	if l.Mode() != lease.Read {
		t.Fatalf("RLock gave a %v holding", l.Mode())
	}
	return l
}

func granted(t *testing.T, ch <-chan lockResult, what string) *lease.Lock {
	t.Helper()
	r := <-ch
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r.l
}

// bothShapes runs test with sessions of their own and with sessions that
// share one Keeper, whose locks wait on its copy of the queue.
func bothShapes(t *testing.T, test func(t *testing.T, cli *clientv3.Client, newS func() *lease.Session)) {
	for _, keeper := range []bool{false, true} {
		t.Run(map[bool]string{false: "own", true: "keeper"}[keeper], func(t *testing.T) {
			cli := etcd.Client(t)
			var opts []lease.Option
			if keeper {
				opts = append(opts, lease.WithKeeper(newKeeper(t, cli)))
			}
			test(t, cli, func() *lease.Session { return newSession(t, cli, opts...) })
		})
	}
}

func mustUnlock(t *testing.T, l *lease.Lock) {
	t.Helper()
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func TestReadersShare(t *testing.T) {
	bothShapes(t, func(t *testing.T, cli *clientv3.Client, newS func() *lease.Session) {
		name := etcdproc.Name(t, "rw-share")
		var held []*lease.Lock
		for i := 0; i < 3; i++ {
			held = append(held, mustRLock(t, newS(), name))
		}
		l, err := newS().TryRLock(etcdproc.Ctx(t, 30*time.Second), name)
		if err != nil {
			t.Fatalf("TryRLock while only readers hold: %v", err)
		}
		held = append(held, l)
		if _, err := newS().TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("TryLock while readers hold: %v, want ErrLocked", err)
		}
		entries, err := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
		if err != nil {
			t.Fatal(err)
		}
		if n := lease.Holding(entries); n != 4 {
			t.Fatalf("Holding = %d of %d entries, want 4", n, len(entries))
		}
		for i, e := range entries {
			if e.Mode != lease.Read || e.Token != held[i].Token() {
				t.Fatalf("entry %d: %+v, want the reader with token %d", i, e, held[i].Token())
			}
		}
		for _, l := range held {
			if l.Err() != nil {
				t.Fatalf("a reader's holding ended: %v", l.Err())
			}
			mustUnlock(t, l)
		}
	})
}

// A writer waits for the readers ahead of it; a reader that queues behind
// the waiting writer waits for the writer (no writer starvation); the
// writer's token is above every reader's it followed.
func TestWriterExcludesReadersFIFO(t *testing.T) {
	bothShapes(t, func(t *testing.T, cli *clientv3.Client, newS func() *lease.Session) {
		name := etcdproc.Name(t, "rw-fifo")
		r1 := mustRLock(t, newS(), name)
		writerCh := lockAsync(etcdproc.Ctx(t, 30*time.Second), newS(), name)
		waitQueued(t, cli, name, 2)
		late := newS()
		lateCh := rlockAsync(etcdproc.Ctx(t, 30*time.Second), late, name)
		waitQueued(t, cli, name, 3)
		lateCh2 := rlockAsync(etcdproc.Ctx(t, 30*time.Second), newS(), name)
		waitQueued(t, cli, name, 4)
		expectPending(t, writerCh, 200*time.Millisecond)
		expectPending(t, lateCh, 0)
		if _, err := newS().TryRLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("TryRLock behind a waiting writer: %v, want ErrLocked", err)
		}
		entries, err := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
		if err != nil {
			t.Fatal(err)
		}
		if modes := []lease.Mode{entries[0].Mode, entries[1].Mode, entries[2].Mode, entries[3].Mode}; modes[0] != lease.Read || modes[1] != lease.Write || modes[2] != lease.Read || modes[3] != lease.Read || lease.Holding(entries) != 1 {
			t.Fatalf("queue modes %v, holding %d; want read, write, read, read and 1", modes, lease.Holding(entries))
		}
		mustUnlock(t, r1)
		w := granted(t, writerCh, "writer after the reader's Unlock")
		if w.Token() <= r1.Token() {
			t.Fatalf("writer token %d not above the reader's %d", w.Token(), r1.Token())
		}
		expectPending(t, lateCh, 200*time.Millisecond)
		expectPending(t, lateCh2, 0)
		mustUnlock(t, w)
		// Both readers behind the writer hold the lock together.
		r2 := granted(t, lateCh, "reader after the writer's Unlock")
		r3 := granted(t, lateCh2, "second reader after the writer's Unlock, while the first holds")
		mustUnlock(t, r2)
		mustUnlock(t, r3)
	})
}

// etcd's Mutex counts as a writer both ways.
func TestReadersInteropConcurrencyMutex(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "rw-mutex")
	cs, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	m := concurrency.NewMutex(cs, name)

	r := mustRLock(t, newSession(t, cli), name)
	if err := m.TryLock(etcdproc.Ctx(t, 30*time.Second)); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while a reader holds: %v, want ErrLocked", err)
	}
	got := make(chan error, 1)
	go func() { got <- m.Lock(etcdproc.Ctx(t, 30*time.Second)) }()
	waitQueued(t, cli, name, 2)
	lateCh := rlockAsync(etcdproc.Ctx(t, 30*time.Second), newSession(t, cli), name)
	waitQueued(t, cli, name, 3)
	select {
	case err := <-got:
		t.Fatalf("Mutex.Lock returned while a reader holds: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	expectPending(t, lateCh, 0)
	mustUnlock(t, r)
	if err := <-got; err != nil {
		t.Fatalf("Mutex.Lock after the reader's Unlock: %v", err)
	}
	expectPending(t, lateCh, 200*time.Millisecond) // behind the Mutex, a writer
	if err := m.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, granted(t, lateCh, "reader after Mutex.Unlock"))
}

// A waiter, reader or writer, whose session or key vanishes returns with
// the loss and is never granted, and the queue behind it moves on with one
// holder at a time (the case etcd's RWMutex recipe gets wrong, etcd#16221).
func TestRWWaiterVanishes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reader bool
		vanish func(t *testing.T, cli *clientv3.Client, s *lease.Session)
	}{
		{"writer's session revoked", false, revokeSession},
		{"reader's session revoked", true, revokeSession},
		{"writer's key deleted", false, deleteSessionKey},
		{"reader's key deleted", true, deleteSessionKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothShapes(t, func(t *testing.T, cli *clientv3.Client, newS func() *lease.Session) {
				name := etcdproc.Name(t, "rw-vanish")
				r := mustRLock(t, newS(), name)
				w1 := lockAsync(etcdproc.Ctx(t, 30*time.Second), newS(), name) // ahead of the vanishing one
				waitQueued(t, cli, name, 2)
				vs := newS()
				take := lockAsync
				if tc.reader {
					take = rlockAsync
				}
				vanishing := take(etcdproc.Ctx(t, 30*time.Second), vs, name)
				waitQueued(t, cli, name, 3)
				w2 := lockAsync(etcdproc.Ctx(t, 30*time.Second), newS(), name)
				waitQueued(t, cli, name, 4)
				tc.vanish(t, cli, vs)
				if r := <-vanishing; !errors.Is(r.err, lease.ErrLost) && !errors.Is(r.err, lease.ErrSessionClosed) {
					t.Fatalf("the vanished waiter returned %v, %v; want a loss", r.l, r.err)
				}
				mustUnlock(t, r)
				first := granted(t, w1, "first writer")
				expectPending(t, w2, 200*time.Millisecond)
				mustUnlock(t, first)
				mustUnlock(t, granted(t, w2, "second writer"))
			})
		})
	}
}

func revokeSession(t *testing.T, cli *clientv3.Client, s *lease.Session) {
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), s.Lease()); err != nil {
		t.Fatal(err)
	}
}

func deleteSessionKey(t *testing.T, cli *clientv3.Client, s *lease.Session) {
	keys, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range keys.Kvs {
		if _, ok := lease.QueueName(kv.Key, s.Lease()); ok {
			if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), string(kv.Key)); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("the session's key was not found")
}

// A read holding fences like any other: a Held guard passes while it
// holds and fails once it has ended.
func TestReadHoldingIsFenced(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "rw-fence")
	r := mustRLock(t, newSession(t, cli), name)
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(r)).Then(clientv3.OpPut(name+"-seen", "1")).Commit(); err != nil {
		t.Fatalf("guarded write under a read holding: %v", err)
	}
	mustUnlock(t, r)
	_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(r)).Then(clientv3.OpPut(name+"-seen", "2")).Commit()
	if !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("guarded write after the reader's Unlock: %v, want ErrNotHeld", err)
	}
}

// Readers wait out a lock delay after a writer's loss, like writers.
func TestLockDelayReaders(t *testing.T) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "rw-delay")
	holder := newSession(t, cli, lease.WithLockDelay(lockDelay))
	mustLock(t, holder, name)
	ch := rlockAsync(etcdproc.Ctx(t, 30*time.Second), newSession(t, cli, lease.WithLockDelay(lockDelay)), name)
	waitQueued(t, cli, name, 2)
	lost := time.Now()
	revokeSession(t, cli, holder)
	r := granted(t, ch, "reader after the writer's loss")
	if d := time.Since(lost); d < lockDelay {
		t.Fatalf("reader granted %v after the writer's loss, want at least %v", d, lockDelay)
	}
	mustUnlock(t, r)
}

// readerDeletes counts the deletion events of some keys that a client
// receives on its watches, and the watches it saw created. keys is filled
// before the client is used.
type readerDeletes struct {
	keys    map[string]bool
	deletes atomic.Int64
	created chan struct{}
}

// client is a client of the test's etcd whose watches r counts.
func (r *readerDeletes) client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(r.interceptor)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func (r *readerDeletes) interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	return countedWatch{s, r}, err
}

type countedWatch struct {
	grpc.ClientStream
	r *readerDeletes
}

func (c countedWatch) RecvMsg(m any) error {
	err := c.ClientStream.RecvMsg(m)
	if wr, ok := m.(*pb.WatchResponse); ok && err == nil {
		if wr.Created {
			select {
			case c.r.created <- struct{}{}:
			default:
			}
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE && c.r.keys[string(ev.Kv.Key)] {
				c.r.deletes.Add(1)
			}
		}
	}
	return err
}

// A reader queued behind a writer, with more than a few readers ahead of
// that writer, waits for the writer's key alone: it is not sent the
// deletions of the readers ahead, which do not block it. (Following every
// deletion, readers behind a writer were sent so many events with 16
// sessions on one client that etcd held their watchers back to its 100 ms
// catch-up loop.) It is still granted once the writer is gone.
func TestReaderBehindWriterIgnoresReaders(t *testing.T) {
	etcdproc.LeakCheck(t)
	name := etcdproc.Name(t, "reader-behind-writer")
	var readers []*lease.Lock
	for i := 0; i < 5; i++ {
		readers = append(readers, mustRLock(t, newSession(t, etcd.Client(t)), name))
	}
	writer := lockAsync(etcdproc.Ctx(t, 30*time.Second), newSession(t, etcd.Client(t)), name)
	waitQueued(t, etcd.Client(t), name, 6)
	counts := &readerDeletes{keys: map[string]bool{}, created: make(chan struct{}, 16)}
	for _, r := range readers {
		counts.keys[r.Key()] = true
	}
	reader := rlockAsync(etcdproc.Ctx(t, 30*time.Second), newSession(t, counts.client(t)), name)
	waitQueued(t, etcd.Client(t), name, 7)
	// Its own-key watch first, then the watch it waits with.
	for i := 0; i < 2; i++ {
		select {
		case <-counts.created:
		case <-etcdproc.Ctx(t, 30*time.Second).Done():
			t.Fatal("the reader opened no watch to wait with")
		}
	}
	for _, r := range readers {
		mustUnlock(t, r)
	}
	w := granted(t, writer, "the writer, once the readers left")
	expectPending(t, reader, 50*time.Millisecond)
	mustUnlock(t, w)
	mustUnlock(t, granted(t, reader, "the reader, once the writer left"))
	if n := counts.deletes.Load(); n != 0 {
		t.Errorf("the reader behind the writer was sent %d deletions of readers ahead of the writer, want 0", n)
	}
}
