package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// leaseOf is the lease a lock's key hangs on, from its name.
func leaseOf(t *testing.T, l *lease.Lock) clientv3.LeaseID {
	t.Helper()
	id, err := strconv.ParseInt(strings.TrimPrefix(l.Key(), l.Name()+"/"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return clientv3.LeaseID(id)
}

// leaseCounts counts locks by the lease their keys are on.
func leaseCounts(t *testing.T, ls []*lease.Lock) map[clientv3.LeaseID]int {
	t.Helper()
	m := map[clientv3.LeaseID]int{}
	for _, l := range ls {
		m[leaseOf(t, l)]++
	}
	return m
}

// A pool takes at most perSession locks through each session, opening one
// when all are full, and takes the next lock through a session that has
// room again once one of its locks ends.
func TestPoolSpreadsLocks(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, err := lease.NewPool(newKeeper(t, cli), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	var ls []*lease.Lock
	for i := range 7 {
		take := p.Lock
		if i%2 == 1 {
			take = p.TryLock
		}
		l, err := take(ctx, etcdproc.Name(t, fmt.Sprint("spread-", i)))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if n := p.Sessions(); n != 3 {
		t.Fatalf("7 locks, 3 a session: %d sessions, want 3", n)
	}
	for id, n := range leaseCounts(t, ls) {
		if n > 3 {
			t.Fatalf("%d locks on lease %x, want at most 3", n, int64(id))
		}
	}
	// Free a place on the first session: the next lock goes there.
	first := leaseOf(t, ls[0])
	if err := ls[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := p.Lock(ctx, etcdproc.Name(t, "spread-again"))
	if err != nil {
		t.Fatal(err)
	}
	if got := leaseOf(t, l); got != first || p.Sessions() != 3 {
		t.Fatalf("the lock after an Unlock is on lease %x with %d sessions, want %x and 3", int64(got), p.Sessions(), int64(first))
	}
}

// Many callers at once open no more sessions than the locks need: one
// session is opened at a time, and the others wait for it.
func TestPoolOpensSessionsOneAtATime(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, err := lease.NewPool(newKeeper(t, cli), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := etcdproc.Ctx(t, 60*time.Second)
	ls := make([]*lease.Lock, 50)
	errs := make([]error, 50)
	var wg sync.WaitGroup
	for i := range ls {
		wg.Go(func() { ls[i], errs[i] = p.Lock(ctx, etcdproc.Name(t, fmt.Sprint("burst-", i))) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	counts := leaseCounts(t, ls)
	if len(counts) != 5 || p.Sessions() != 5 {
		t.Fatalf("50 locks, 10 a session: on %d leases with %d sessions, want 5", len(counts), p.Sessions())
	}
}

// A session the pool loses ends its own locks only; the next lock is
// taken through another session, and Close ends the rest with
// ErrSessionClosed and refuses later calls.
func TestPoolLostSessionAndClose(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, err := lease.NewPool(newKeeper(t, cli), 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx := etcdproc.Ctx(t, 30*time.Second)
	var ls []*lease.Lock
	for i := range 4 {
		l, err := p.Lock(ctx, etcdproc.Name(t, fmt.Sprint("lost-", i)))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	lost := leaseOf(t, ls[0])
	if _, err := cli.Revoke(ctx, lost); err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if leaseOf(t, l) != lost {
			continue
		}
		select {
		case <-l.Done():
		case <-ctx.Done():
			t.Fatal("a lock of the revoked lease did not end")
		}
		if !errors.Is(l.Err(), lease.ErrLost) {
			t.Fatalf("a lock of the revoked lease ended with %v, want ErrLost", l.Err())
		}
	}
	l, err := p.Lock(ctx, etcdproc.Name(t, "after-loss"))
	if err != nil {
		t.Fatal(err)
	}
	if leaseOf(t, l) == lost {
		t.Fatal("a lock was taken through the lost session")
	}
	ls = append(ls, l)
	for _, l := range ls {
		if leaseOf(t, l) != lost && l.Err() != nil {
			t.Fatalf("a lock of another session ended: %v", l.Err())
		}
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, l := range ls {
		if leaseOf(t, l) == lost {
			continue
		}
		<-l.Done()
		if !errors.Is(l.Err(), lease.ErrSessionClosed) {
			t.Fatalf("a lock ended with %v at Close, want ErrSessionClosed", l.Err())
		}
	}
	if _, err := p.Lock(ctx, etcdproc.Name(t, "closed")); !errors.Is(err, lease.ErrSessionClosed) {
		t.Fatalf("Lock after Close: %v, want ErrSessionClosed", err)
	}
	if err := p.Close(); !errors.Is(err, lease.ErrSessionClosed) {
		t.Fatalf("a second Close: %v, want ErrSessionClosed", err)
	}
}

// Bad input is refused before anything is sent.
func TestPoolInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	for _, tc := range []struct {
		name string
		k    *lease.Keeper
		per  int
		opts []lease.Option
	}{
		{"nil Keeper", nil, 1, nil},
		{"no room", k, 0, nil},
		{"a Keeper of its own", k, 1, []lease.Option{lease.WithKeeper(k)}},
		{"nil Option", k, 1, []lease.Option{nil}},
		{"bad TTL", k, 1, []lease.Option{lease.WithTTL(-time.Second)}},
	} {
		if _, err := lease.NewPool(tc.k, tc.per, tc.opts...); !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	p, err := lease.NewPool(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Lock(context.Background(), ""); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("an empty name: %v, want ErrInvalidArgument", err)
	}
}

// A waiter whose session's lease is revoked (its key deleted before the
// session hears of the loss) is not ended: the pool queues it again
// through a new session, and it is granted once the holder goes. Found by
// a cold review: the pool gave the caller the deletion.
func TestPoolRetriesWaiterOfRevokedLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	other := newSession(t, cli)
	name := etcdproc.Name(t, "retry")
	holder := mustLock(t, other, name)
	p, err := lease.NewPool(newKeeper(t, cli), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	res := make(chan lockResult, 1)
	go func() { l, err := p.Lock(ctx, name); res <- lockResult{l, err} }()
	waitQueued(t, cli, name, 2)
	keys := queueKeys(t, cli, name)
	id, err := strconv.ParseInt(strings.TrimPrefix(keys[len(keys)-1], name+"/"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	revoked := clientv3.LeaseID(id)
	if _, err := cli.Revoke(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	// Queued again through a new session: a key of another lease behind
	// the holder's.
	waitQueued(t, cli, name, 2)
	select {
	case r := <-res:
		t.Fatalf("the pool's Lock returned while the holder held: %v", r.err)
	default:
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("Lock after its session's lease was revoked: %v", r.err)
	}
	if got := leaseOf(t, r.l); got == revoked || r.l.Err() != nil {
		t.Fatalf("granted on lease %x (revoked %x), Err %v", int64(got), int64(revoked), r.l.Err())
	}
	if n := p.Sessions(); n != 1 {
		t.Fatalf("%d sessions, want 1", n)
	}
}

// A hook that panics in a pool's Lock, recovered by the caller, leaves the
// pool's counts as they were: the next lock goes to the same session.
func TestPoolHookPanicKeepsCount(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	hooks := &lease.Hooks{Call: func(ctx context.Context, c lease.Call) (context.Context, *lease.CallHooks) {
		if strings.HasSuffix(c.Name, "boom") {
			panic("hook")
		}
		return ctx, nil
	}}
	p, err := lease.NewPool(newKeeper(t, cli), 1, lease.WithHooks(hooks))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	l, err := p.Lock(ctx, etcdproc.Name(t, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = p.Lock(ctx, etcdproc.Name(t, "boom"))
		t.Error("the hook did not panic")
	}()
	if _, err := p.Lock(ctx, etcdproc.Name(t, "c")); err != nil {
		t.Fatal(err)
	}
	if n := p.Sessions(); n != 1 {
		t.Fatalf("%d sessions after a recovered hook panic, want 1", n)
	}
}

// A lock that ended frees its place on its session by the time its Done
// closes, and so by the time Unlock returns: the pool's next lock goes
// there, not through a new session.
func TestPoolPlaceFreeOnceLockEnds(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, err := lease.NewPool(newKeeper(t, cli), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	for i := range 20 {
		l, err := p.Lock(ctx, etcdproc.Name(t, fmt.Sprint("freed-", i)))
		if err != nil {
			t.Fatal(err)
		}
		id := leaseOf(t, l)
		if _, err := cli.Delete(ctx, l.Key()); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			<-l.Done()
		} else if err := l.Unlock(ctx); !errors.Is(err, lease.ErrKeyDeleted) {
			t.Fatalf("round %d: Unlock after its key went: %v, want ErrKeyDeleted", i, err)
		}
		next, err := p.Lock(ctx, etcdproc.Name(t, fmt.Sprint("freed-next-", i)))
		if err != nil {
			t.Fatal(err)
		}
		if got := leaseOf(t, next); got != id || p.Sessions() != 1 {
			t.Fatalf("round %d: the next lock is on lease %x with %d sessions, want %x and 1", i, int64(got), p.Sessions(), int64(id))
		}
		if err := next.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A pool that finds an ended session, in the same look that finds room on
// a live one, keeps using the room it found: the place is not lost, and
// the live session is not left looking full.
func TestPoolRoomBesideEndedSession(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, err := lease.NewPool(newKeeper(t, cli), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	first, err := p.Lock(ctx, etcdproc.Name(t, "beside-first"))
	if err != nil {
		t.Fatal(err)
	}
	room := leaseOf(t, first)
	second, err := p.Lock(ctx, etcdproc.Name(t, "beside-second"))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, leaseOf(t, second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.SessionOf(second).Done():
	case <-ctx.Done():
		t.Fatal("the revoked session did not end")
	}
	for i := range 3 {
		l, err := p.Lock(ctx, etcdproc.Name(t, fmt.Sprint("beside-", i)))
		if err != nil {
			t.Fatal(err)
		}
		if got := leaseOf(t, l); got != room || p.Sessions() != 1 {
			t.Fatalf("round %d: the lock is on lease %x with %d sessions, want %x and 1", i, int64(got), p.Sessions(), int64(room))
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
