package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Waiters far back in a queue of steady contenders follow the two newest
// keys ahead through watches that outlive each lock (a session's key keeps
// its name from one lock to the next). Once the order has settled a
// handoff opens no watch of a key ahead, and a waiter reads the queue once
// in full as it queues and once keys-only when the older of its two keys
// goes, with its queue watch up: the newer one then holds the lock, and
// its deletion, delivered by the queue watch in order with the own key's
// changes, grants the waiter with no read. So each handoff opens one
// queue watch and reads no single key (the own key, as it is granted,
// before). The locks are granted in token order throughout.
func TestFarWaitersFollowAcrossHandoffs(t *testing.T) {
	etcdproc.LeakCheck(t)
	name := etcdproc.Name(t, "follow")
	reads := &queueReads{prefix: name + "/"}
	creates := watchCreatesUnder(name + "/")
	keyCreates := keyWatchCreatesUnder(name + "/")
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(reads.interceptor), grpc.WithChainStreamInterceptor(creates.interceptor, keyCreates.interceptor)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	// Eight contenders: each queues behind seven keys, more than nearAhead.
	const contenders, rounds, settle = 8, 8, 3
	queued := make(chan struct{}, contenders)
	hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
		if delta > 0 {
			select {
			case queued <- struct{}{}:
			default:
			}
		}
	}}
	holder := mustLock(t, newSession(t, cli), name)

	type counts struct{ creates, keyCreates, full, keysOnly, singles int64 }
	read := func() counts {
		return counts{creates.n.Load(), keyCreates.n.Load(), reads.n.Load(), reads.keysOnly.Load(), reads.singles.Load()}
	}
	var (
		mu     sync.Mutex
		tokens []int64 // in the order the locks were held
		steady counts  // read once settle rounds were done
	)
	errs := make(chan error, contenders)
	var wg sync.WaitGroup
	for i := 0; i < contenders; i++ {
		s := newSession(t, cli, lease.WithHooks(hooks))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				l, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if tokens = append(tokens, l.Token()); len(tokens) == contenders*settle {
					steady = read()
				}
				mu.Unlock()
				if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
					errs <- err
					return
				}
			}
		}()
		<-queued // one at a time, so that each first queues behind the last
	}
	mustUnlock(t, holder)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	end := read()

	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("held with token %d after %d", tokens[i], tokens[i-1])
		}
	}
	handoffs := int64(contenders * (rounds - settle))
	got := counts{end.creates - steady.creates, end.keyCreates - steady.keyCreates, end.full - steady.full,
		end.keysOnly - steady.keysOnly, end.singles - steady.singles}
	t.Logf("%d handoffs once settled: %d watches opened (%d of keys ahead), %d full reads of the queue, %d keys-only, %d reads of single keys",
		handoffs, got.creates, got.keyCreates, got.full, got.keysOnly, got.singles)
	// A change in the order of the queue (two releasers queueing again
	// in the other order) costs a few; each far wait with a watch of its
	// own would cost one per handoff.
	if got.keyCreates > handoffs/4 {
		t.Errorf("%d watches of keys ahead opened in %d handoffs, want few: they should outlive each lock", got.keyCreates, handoffs)
	}
	if queue := got.creates - got.keyCreates; queue > handoffs+handoffs/4 {
		t.Errorf("%d queue watches opened in %d handoffs, want about one each (as a far waiter comes second)", queue, handoffs)
	}
	if got.singles > handoffs/4 {
		t.Errorf("%d reads of single keys in %d handoffs, want few: a grant read its own key", got.singles, handoffs)
	}
	if got.full > handoffs+handoffs/4 {
		t.Errorf("%d full reads of the queue in %d handoffs, want about one each (as it queues)", got.full, handoffs)
	}
	if got.keysOnly > handoffs+handoffs/4 {
		t.Errorf("%d keys-only reads in %d handoffs, want about one each (when the older followed key goes)", got.keysOnly, handoffs)
	}
}

// A far waiter whose followed keys go without having held the lock (their
// waiters gave up) reads its view again and follows the next keys: it is
// granted only once every key ahead of it has gone, in token order.
func TestFarWaiterWhoseFollowedKeysGiveUp(t *testing.T) {
	etcdproc.LeakCheck(t)
	name := etcdproc.Name(t, "follow-give-up")
	cli := etcd.Client(t)
	queued := make(chan struct{}, 8)
	hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
		if delta > 0 {
			queued <- struct{}{}
		}
	}}
	holder := mustLock(t, newSession(t, cli), name)
	var waiters []<-chan lockResult // in queue order
	var cancels []context.CancelFunc
	for i := 0; i < 6; i++ {
		ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
		t.Cleanup(cancel)
		waiters = append(waiters, lockAsync(ctx, newSession(t, cli, lease.WithHooks(hooks)), name))
		cancels = append(cancels, cancel)
		<-queued
	}
	// The last waiter has six keys ahead and follows the two newest, the
	// waiters just before it; both give up.
	last := waiters[5]
	for _, i := range []int{4, 3} {
		cancels[i]()
		if r := <-waiters[i]; r.err == nil {
			t.Fatalf("waiter %d was granted; want it to give up", i)
		}
	}
	select {
	case r := <-last:
		t.Fatalf("last waiter granted (token %d, %v) with the holder and three waiters ahead", tokenOf(r.l), r.err)
	case <-time.After(200 * time.Millisecond):
	}
	prev := holder.Token()
	mustUnlock(t, holder)
	for i := 0; i < 3; i++ {
		select {
		case r := <-waiters[i]:
			if r.err != nil {
				t.Fatalf("waiter %d: %v", i, r.err)
			}
			if r.l.Token() <= prev {
				t.Errorf("waiter %d granted token %d after %d", i, r.l.Token(), prev)
			}
			prev = r.l.Token()
			mustUnlock(t, r.l)
		case r := <-last:
			t.Fatalf("last waiter granted (token %d, %v) with %d waiters ahead", tokenOf(r.l), r.err, 3-i)
		}
	}
	select {
	case r := <-last:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.l.Token() <= prev {
			t.Errorf("last waiter granted token %d after %d", r.l.Token(), prev)
		}
		mustUnlock(t, r.l)
	case <-time.After(5 * time.Second):
		t.Fatal("last waiter not granted 5 s after the queue ahead drained")
	}
}

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

// rawQueueKey puts name/<hex lease> on a fresh lease, as etcd's own lock
// code (concurrency.Mutex, etcdctl lock) does: a queue key with no
// leasefence lock behind it.
func rawQueueKey(t *testing.T, cli *clientv3.Client, name string) string {
	t.Helper()
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Revoke(context.Background(), g.ID) })
	key := fmt.Sprintf("%s/%x", name, int64(g.ID))
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), key, "", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Delete(context.Background(), key) })
	return key
}

// A far waiter (H, K1, K2, K3 ahead) follows K3 and K2. K1, which it does
// not follow, is moved off its lease: it is no lock any more. K2 goes;
// rereadFar's keys-only read shows H, K1, K3 with the creation revisions
// the waiter knows, so relist lists K1 as the blocking key it was; three
// ahead makes the waiter near, on the queue watch, which came up after
// K1's put. H and K3 go: the waiter's turn has come.
func TestFarTurnedNearBehindKeyMovedOffLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "far-near-moved")
	var ks []string
	for range 4 { // H, K1, K2, K3
		ks = append(ks, rawQueueKey(t, cli, name))
	}
	h, k1, k2, k3 := ks[0], ks[1], ks[2], ks[3]
	tp := newTap()
	ws := newSession(t, tapClient(t, tp))
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	wch := lockAsync(ctx, ws, name)
	waitQueued(t, cli, name, 5)
	tp.await(etcdproc.Ctx(t, 30*time.Second), t, "the waiter following K3 and K2", func(tp *tap) bool { return tp.readAfter(k3, k2) })

	moveOffLease(t, cli, k1)
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), k2); err != nil {
		t.Fatal(err)
	}
	expectPending(t, wch, 200*time.Millisecond) // H holds
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), h); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), k3); err != nil {
		t.Fatal(err)
	}
	// Only K1 is left ahead, and it is no lock.
	l := grantWithin(t, wch, 5*time.Second, "the waiter behind only a key moved off its lease")
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}
