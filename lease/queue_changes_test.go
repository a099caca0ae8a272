package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/holdback"
	"github.com/leasefence/leasefence/lease"
)

// Cold review of f7e3b52 (issue 35): attacks against a real etcd.

// txnGate holds one Txn call of a client that pick chooses: before it is
// sent (before) or after etcd answered it, until release.
type txnGate struct {
	mu      sync.Mutex
	pick    func(*pb.TxnRequest) bool
	before  bool
	held    chan struct{}
	release chan struct{}
}

func newTxnGate() *txnGate {
	return &txnGate{held: make(chan struct{}), release: make(chan struct{})}
}

func (g *txnGate) arm(before bool, pick func(*pb.TxnRequest) bool) {
	g.mu.Lock()
	g.before, g.pick = before, pick
	g.mu.Unlock()
}

func (g *txnGate) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	tr, _ := req.(*pb.TxnRequest)
	g.mu.Lock()
	picked := tr != nil && g.pick != nil && g.pick(tr)
	if picked {
		g.pick = nil
	}
	before := g.before
	g.mu.Unlock()
	if picked && before {
		close(g.held)
		<-g.release
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if picked && !before {
		close(g.held)
		<-g.release
	}
	return err
}

func (g *txnGate) awaitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-g.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the Txn to hold was never sent")
	}
}

// putsKey tells whether tr's success branch puts key.
func putsKey(tr *pb.TxnRequest, key string) bool {
	for _, op := range tr.Success {
		if p := op.GetRequestPut(); p != nil && string(p.Key) == key {
			return true
		}
	}
	return false
}

// moveSeen is a watch hook that closes seen once a watch response shows a
// put of key with no lease; it holds nothing back.
type moveSeen struct {
	mu   sync.Mutex
	key  string
	seen chan struct{}
}

func (m *moveSeen) Send(*pb.WatchRequest) {}

func (m *moveSeen) Recv(wr *pb.WatchResponse) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ev := range wr.Events {
		if m.key != "" && ev.Type == mvccpb.PUT && string(ev.Kv.Key) == m.key && ev.Kv.Lease == 0 {
			select {
			case <-m.seen:
			default:
				close(m.seen)
			}
		}
	}
	return false
}

func passStreams(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(ctx, desc, cc, method, opts...)
}

// A watch may deliver a change before the answer of the lock's own put
// (the rule keeps own-key events for that reason, and records deletions
// of other keys before the token). A put that moves a key ahead off its
// lease, delivered before the token is known, is dropped: the snapshot
// at the token lists the key, and nothing ever says it went.
//
// W's queue watch is up from its previous lock (a near waiter). W's next
// lock puts its key; etcd's answer is held back while H's key, the
// holder's, is moved off its lease and W's queue watch delivers the move.
func TestKeyMovedOffLeaseBeforeTokenKnown(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	g := newTxnGate()
	seen := &moveSeen{seen: make(chan struct{})}
	wcli := holdback.Client(t, etcd.Endpoints(), g.unary, holdback.WatchStreams(seen, nil))
	name := etcdproc.Name(t, "move-before-token")
	hs, ws := newSession(t, cli), newSession(t, wcli)

	// W waits once near the head: its queue and own-key watches come up
	// and stay up for idleWatch after its lock.
	h1 := mustLock(t, hs, name)
	wch := lockAsync(etcdproc.Ctx(t, 30*time.Second), ws, name)
	waitQueued(t, cli, name, 2)
	if err := h1.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	w1 := grantWithin(t, wch, 5*time.Second, "W's first lock")
	hch := lockAsync(etcdproc.Ctx(t, 30*time.Second), hs, name)
	waitQueued(t, cli, name, 2)
	if err := w1.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	h2 := grantWithin(t, hch, 5*time.Second, "H's second lock")

	wkey := keyOf(name, ws)
	g.arm(false, func(tr *pb.TxnRequest) bool { return putsKey(tr, wkey) })
	seen.mu.Lock()
	seen.key = h2.Key()
	seen.mu.Unlock()
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	w2ch := lockAsync(ctx, ws, name)
	g.awaitHeld(t) // W's key is put; its answer is held
	moveOffLease(t, cli, h2.Key())
	expectDone(t, h2.Done(), 5*time.Second, "the holder whose key moved off its lease")
	select {
	case <-seen.seen:
	case <-time.After(5 * time.Second):
		t.Fatal("W's watch never delivered the move (its queue watch was not up)")
	}
	time.Sleep(200 * time.Millisecond) // the client hands the response to the lock
	close(g.release)
	l := grantWithin(t, w2ch, 3*time.Second, "W's lock behind a key moved off its lease before its put's answer came")
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A Proclaim sent just before someone else's put moves the leader's key
// off its lease is applied after it: its guard (creation revision only)
// still holds, and its put attaches the key to the lease again. The
// leadership has ended (ErrKeyDeleted) and the next candidate was elected
// on the move, yet the key is a queue key again, older than the new
// leader's: a third candidate queues behind it after the new leader
// resigns, and the old leader's session gets ErrKeyInUse on the name.
func TestProclaimDoesNotReattachMovedKey(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	g := newTxnGate()
	lcli := holdback.Client(t, etcd.Endpoints(), g.unary, passStreams)
	name := etcdproc.Name(t, "proclaim-moved")
	ls, xs, ys := newSession(t, lcli), newSession(t, cli), newSession(t, cli)
	old := mustCampaign(t, ls, name, "v1")
	type campaignResult struct {
		e   *lease.Leadership
		err error
	}
	xch := make(chan campaignResult, 1)
	go func() {
		e, err := xs.Campaign(etcdproc.Ctx(t, 30*time.Second), name, "x")
		xch <- campaignResult{e, err}
	}()
	waitQueued(t, cli, name, 2)

	g.arm(true, func(tr *pb.TxnRequest) bool { return putsKey(tr, old.Key()) })
	perr := make(chan error, 1)
	go func() { perr <- old.Proclaim(etcdproc.Ctx(t, 30*time.Second), "v2") }()
	g.awaitHeld(t) // past its checks, not yet sent
	moveOffLease(t, cli, old.Key())
	expectDone(t, old.Done(), 5*time.Second, "the leader whose key moved off its lease")
	var x *lease.Leadership
	select {
	case r := <-xch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		x = r.e
	case <-time.After(5 * time.Second):
		t.Fatal("the next candidate was not elected")
	}
	close(g.release)
	t.Logf("the old leader's Proclaim returned %v (its leadership ended with %v)", <-perr, old.Err())

	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), old.Key())
	if err != nil {
		t.Fatal(err)
	}
	if kv := firstKVOf(resp.Kvs); kv != nil && kv.Lease != 0 {
		t.Errorf("the old leader's key %s (created %d) is on lease %x again, older than the new leader's key (token %d)",
			kv.Key, kv.CreateRevision, kv.Lease, x.Token())
		entries, _ := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
		t.Logf("Inspect: %+v", entries)
		ych := lockAsync(etcdproc.Ctx(t, 30*time.Second), ys, name)
		waitQueued(t, cli, name, 3)
		if err := x.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-ych:
			t.Logf("third lock after the new leader resigned: err=%v", r.err)
			if r.l != nil {
				r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
			}
		case <-time.After(3 * time.Second):
			t.Errorf("a third lock stays queued behind the revived key after the new leader resigned")
		}
		if _, err := ls.TryLock(etcdproc.Ctx(t, 30*time.Second), name); err != nil {
			t.Logf("the old leader's session on the name: %v", err)
		}
		ls.Close() // frees the name for the cleanup
	} else if err := x.Resign(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func firstKVOf(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// A put of the session's lock key had no answer and was withdrawn; then
// another client sharing the lease (a concurrency.Mutex, the case
// ErrKeyInUse exists for) takes the name. Its key is never taken for an
// orphan: the session's own lock fails with ErrKeyInUse, and another
// session's lock waits behind it.
func TestSharedLeaseKeyNotTakenAfterUnansweredPut(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	name := etcdproc.Name(t, "shared-after-unanswered")
	lease.Withdraw(s, name) // an unanswered put that etcd never applied
	cs, err := concurrency.NewSession(cli, concurrency.WithLease(s.Lease()))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Orphan()
	m := concurrency.NewMutex(cs, name)
	if err := m.Lock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	l, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
	if !errors.Is(err, lease.ErrKeyInUse) {
		t.Errorf("Lock over a concurrency.Mutex holding on the same lease: %v, want ErrKeyInUse", err)
	}
	if l != nil {
		l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	}
	och := lockAsync(etcdproc.Ctx(t, 30*time.Second), newSession(t, cli), name)
	waitQueued(t, cli, name, 2)
	expectPending(t, och, time.Second)
	if err := m.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	o := grantWithin(t, och, 5*time.Second, "the other session's lock, once the Mutex let go")
	o.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// A writer's key whose value someone else sets to ReaderValue (lease
// kept) is a reader's key to every lock of the name, yet the writer's
// Lock stays held: a waiting reader is granted beside it.
func TestWriterKeyTurnedReaderEndsHolding(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "writer-turned-reader")
	ws, rs := newSession(t, cli), newSession(t, cli)
	w := mustLock(t, ws, name)
	rch := make(chan lockResult, 1)
	go func() {
		l, err := rs.RLock(etcdproc.Ctx(t, 30*time.Second), name)
		rch <- lockResult{l, err}
	}()
	waitQueued(t, cli, name, 2)
	expectPending(t, rch, 100*time.Millisecond)
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), w.Key(), lease.ReaderValue, clientv3.WithLease(ws.Lease())); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-rch:
		if r.err == nil {
			select {
			case <-w.Done(): // its key, now a reader's, is no longer its holding
			case <-time.After(5 * time.Second):
				t.Errorf("reader granted (token %d) while the writer (token %d) still holds", r.l.Token(), w.Token())
			}
			r.l.Unlock(etcdproc.Ctx(t, 30*time.Second))
		}
	case <-time.After(2 * time.Second):
	}
	w.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// stressCfg is one stress run's shape.
type stressCfg struct {
	keeper  bool
	delay   time.Duration
	workers int
	iters   int
	readers bool // every third lock is an RLock
	try     bool // every fifth is a TryLock (or TryRLock)
	moves   bool // a chaos loop moves queue keys off their leases
	junk    bool // a loop toggles the Keeper's copy into counting and back
	hold    time.Duration
}

// runStress runs cfg's workers on one name. Without moves it checks
// exclusion as the grants are; with them only that no Lock waits out its
// ctx (20 s) while the name keeps moving.
func runStress(t *testing.T, cfg stressCfg) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "stress")
	var opts []lease.Option
	if cfg.keeper {
		opts = append(opts, lease.WithKeeper(newKeeper(t, cli)))
	}
	if cfg.delay > 0 {
		opts = append(opts, lease.WithLockDelay(cfg.delay))
	}
	var writers, readers, grants, hangs, violations atomicCounter
	stop := make(chan struct{})
	var chaos sync.WaitGroup
	if cfg.moves {
		chaos.Add(1)
		go func() {
			defer chaos.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(30+i%50) * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(8))
				if err == nil && len(resp.Kvs) > 0 {
					var kv *mvccpb.KeyValue
					for j, c := range resp.Kvs {
						if c.Lease != 0 && (j == i%len(resp.Kvs) || kv == nil) {
							kv = c
						}
					}
					if kv != nil {
						cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
							Then(clientv3.OpPut(string(kv.Key), "moved")).Commit()
					}
				}
				cancel()
			}
		}()
	}
	if cfg.junk {
		chaos.Add(1)
		go func() {
			defer chaos.Done()
			for round := 0; round < 3; round++ {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				for b := 0; b < (lease.KeeperMirrorLimit+100)/100; b++ {
					var ops []clientv3.Op
					for j := 0; j < 100; j++ {
						ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/junk/%d-%d", name, round, b*100+j), "x"))
					}
					if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
						break
					}
				}
				select {
				case <-stop:
				case <-time.After(500 * time.Millisecond):
				}
				cli.Delete(ctx, name+"/junk/", clientv3.WithPrefix())
				cancel()
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for w := range cfg.workers {
		s := newSession(t, cli, opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cfg.iters {
				read := cfg.readers && (i+w)%3 == 0
				try := cfg.try && (i+w)%5 == 0
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				var l *lease.Lock
				var err error
				switch {
				case read && try:
					l, err = s.TryRLock(ctx, name)
				case read:
					l, err = s.RLock(ctx, name)
				case try:
					l, err = s.TryLock(ctx, name)
				default:
					l, err = s.Lock(ctx, name)
				}
				cancel()
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) {
						hangs.add(1)
						entries, _ := lease.Inspect(context.Background(), cli, name)
						t.Errorf("worker %d lock %d (read=%v) waited out its ctx: %v; queue now %+v", w, i, read, err, entries)
					} else if !errors.Is(err, lease.ErrLocked) && !errors.Is(err, lease.ErrKeyDeleted) && !errors.Is(err, lease.ErrLost) {
						t.Errorf("worker %d lock %d: %v", w, i, err)
					}
					continue
				}
				grants.add(1)
				if !cfg.moves {
					if read {
						readers.add(1)
						if writers.get() != 0 {
							violations.add(1)
							t.Errorf("reader %s (token %d) granted while a writer holds", l.Key(), l.Token())
						}
					} else {
						if writers.add(1) != 1 || readers.get() != 0 {
							violations.add(1)
							t.Errorf("writer %s (token %d) granted beside another holder (writers %d, readers %d)", l.Key(), l.Token(), writers.get(), readers.get())
						}
					}
				}
				if cfg.hold > 0 {
					time.Sleep(time.Duration(i%3) * cfg.hold / 2)
				}
				if !cfg.moves {
					if read {
						readers.add(-1)
					} else {
						writers.add(-1)
					}
				}
				uctx, ucancel := context.WithTimeout(context.Background(), 10*time.Second)
				l.Unlock(uctx)
				ucancel()
			}
		}()
	}
	wg.Wait()
	close(stop)
	chaos.Wait()
	t.Logf("%+v: %d grants, %d hangs, %d violations", cfg, grants.get(), hangs.get(), violations.get())
}

type atomicCounter struct {
	mu sync.Mutex
	n  int64
}

func (c *atomicCounter) add(d int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += d
	return c.n
}

func (c *atomicCounter) get() int64 { return c.add(0) }

func TestQueueChangesStress(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, cfg := range []stressCfg{
		{workers: 8, iters: 30},
		{workers: 8, iters: 30, keeper: true},
		{workers: 8, iters: 30, readers: true, try: true},
		{workers: 8, iters: 30, readers: true, try: true, keeper: true},
		{workers: 6, iters: 15, keeper: true, delay: time.Second, hold: 2 * time.Millisecond},
		{workers: 8, iters: 25, moves: true},
		{workers: 8, iters: 25, moves: true, keeper: true, readers: true},
		{workers: 8, iters: 25, moves: true, readers: true, try: true},
		{workers: 8, iters: 30, keeper: true, junk: true, readers: true},
	} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) { runStress(t, cfg) })
	}
}

// Keeper waiters while the copy counts (more than KeeperMirrorLimit keys
// under the name) and after it comes back: each handoff is granted.
func TestKeeperCountingHandoffs(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	name := etcdproc.Name(t, "counting")
	ss := []*lease.Session{newSession(t, cli, lease.WithKeeper(k)), newSession(t, cli, lease.WithKeeper(k)), newSession(t, cli, lease.WithKeeper(k))}
	handoffs := func(phase string) {
		held := mustLock(t, ss[0], name)
		for i := range 12 {
			s := ss[(i+1)%len(ss)]
			ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), s, name)
			waitQueued(t, cli, name, 2)
			if err := held.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
			held = grantWithin(t, ch, 3*time.Second, fmt.Sprintf("%s: handoff %d", phase, i))
		}
		held.Unlock(etcdproc.Ctx(t, 30*time.Second))
	}
	handoffs("copy valid")
	for b := 0; b < (lease.KeeperMirrorLimit+200)/100; b++ {
		var ops []clientv3.Op
		for j := 0; j < 100; j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/data/%d", name, b*100+j), "x"))
		}
		if _, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lease.AwaitKeeperMirror(etcdproc.Ctx(t, 30*time.Second), k, name, func(s lease.KeeperMirrorState) bool { return s.Counting }); err != nil {
		t.Fatal(err)
	}
	handoffs("copy counting")
	// Readers and a writer behind them while counting.
	r1 := mustRLock(t, ss[0], name)
	wch := lockAsync(etcdproc.Ctx(t, 30*time.Second), ss[1], name)
	waitQueued(t, cli, name, 2)
	rch := make(chan lockResult, 1)
	go func() { l, err := ss[2].RLock(etcdproc.Ctx(t, 30*time.Second), name); rch <- lockResult{l, err} }()
	waitQueued(t, cli, name, 3)
	expectPending(t, rch, 100*time.Millisecond)
	r1.Unlock(etcdproc.Ctx(t, 30*time.Second))
	w := grantWithin(t, wch, 3*time.Second, "writer behind a reader, copy counting")
	expectPending(t, rch, 100*time.Millisecond)
	w.Unlock(etcdproc.Ctx(t, 30*time.Second))
	grantWithin(t, rch, 3*time.Second, "reader behind the writer, copy counting").Unlock(etcdproc.Ctx(t, 30*time.Second))
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), name+"/data/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.AwaitKeeperMirror(etcdproc.Ctx(t, 30*time.Second), k, name, func(s lease.KeeperMirrorState) bool { return s.Valid }); err != nil {
		t.Fatal(err)
	}
	handoffs("copy back")
}

// TestKeeperWaiterAcrossSharedWatchPause with moves instead of deletions:
// the loss is a move off the lease, and so is the end of the holder the
// waiter that joined the copy queues behind.
func TestKeeperPauseWithMoves(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	opts := []lease.Option{lease.WithKeeper(k), lease.WithLockDelay(time.Second)}
	a, b := newSession(t, cli, opts...), newSession(t, cli, opts...)
	for trial := range 3 {
		name := etcdproc.Name(t, fmt.Sprintf("keeper-pause-move-%d", trial))
		for range 7 {
			l := mustLock(t, a, name)
			if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		lost := mustLock(t, newSession(t, cli, opts...), name)
		moveOffLease(t, cli, lost.Key())
		expectDone(t, lost.Done(), 5*time.Second, "the lock whose key moved")
		// waitQueued would count the moved key: wait for each key itself.
		ach := lockAsync(etcdproc.Ctx(t, 30*time.Second), a, name)
		waitKey(t, cli, keyOf(name, a))
		bch := lockAsync(etcdproc.Ctx(t, 30*time.Second), b, name)
		waitKey(t, cli, keyOf(name, b))
		start := time.Now()
		var first *lease.Lock
		select {
		case r := <-ach:
			if r.err != nil {
				t.Fatal(r.err)
			}
			first = r.l
		case <-time.After(15 * time.Second):
			entries, _ := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
			rec, _ := cli.Get(etcdproc.Ctx(t, 30*time.Second), lease.DelayRecordKey(name))
			all, _ := cli.Get(etcdproc.Ctx(t, 30*time.Second), name+"/", clientv3.WithPrefix())
			t.Fatalf("trial %d: the lock after the loss not granted in 15s; Inspect %+v; record %v; keys %v", trial, entries, rec.Kvs, all.Kvs)
		}
		t.Logf("trial %d: the lock after the loss granted after %v", trial, time.Since(start).Round(time.Millisecond))
		expectPending(t, bch, 50*time.Millisecond)
		moveOffLease(t, cli, first.Key())
		l := grantWithin(t, bch, 5*time.Second, fmt.Sprintf("trial %d: the waiter behind a holder moved off its lease", trial))
		if l.Token() <= first.Token() {
			t.Fatalf("token %d not above %d", l.Token(), first.Token())
		}
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// waitKey waits until key exists.
func waitKey(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	wch := cli.Watch(ctx, key, clientv3.WithCreatedNotify())
	<-wch
	for {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) > 0 {
			return
		}
		select {
		case <-wch:
		case <-ctx.Done():
			t.Fatalf("%s never put", key)
		}
	}
}
