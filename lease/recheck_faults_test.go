package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// recheckCtl intercepts a client's reads of single keys under prefix in
// transactions with no comparison (what a held lock's recheck sends) once
// armed: it fails the next fail of them, and holds the others back on
// held until released (nil: sent on; else failed with that error).
type recheckCtl struct {
	prefix string

	mu    sync.Mutex
	armed bool
	fail  int
	hold  bool
	seen  int

	held chan *heldRead
}

// cutLink is a client's link to etcd that a test can cut (the proxy
// closed) and mend (a proxy started again at the same address).
type cutLink struct {
	p                 *etcdproc.Proxy
	url, addr, target string
}

func newCutLink(t *testing.T) *cutLink {
	t.Helper()
	target := etcd.Endpoints()[0]
	p, url := etcdproc.ProxyT(t, target)
	return &cutLink{p: p, url: url, addr: strings.TrimPrefix(url, "http://"), target: target}
}

func (c *cutLink) cut() { c.p.Close() }

func (c *cutLink) mend(t *testing.T) { c.p = etcdproc.ProxyAt(t, c.addr, c.target) }

type heldRead struct {
	keys    []string
	release chan error
}

func newRecheckCtl(prefix string) *recheckCtl {
	return &recheckCtl{prefix: prefix, held: make(chan *heldRead, 100)}
}

func (c *recheckCtl) set(armed bool, fail int, hold bool) {
	c.mu.Lock()
	c.armed, c.fail, c.hold = armed, fail, hold
	c.mu.Unlock()
}

func (c *recheckCtl) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}

func (c *recheckCtl) match(req any) ([]string, bool) {
	r, ok := req.(*pb.TxnRequest)
	if !ok || len(r.Compare) > 0 || len(r.Failure) > 0 || len(r.Success) == 0 {
		return nil, false
	}
	var keys []string
	for _, op := range r.Success {
		rr := op.GetRequestRange()
		if rr == nil || len(rr.RangeEnd) > 0 || !strings.HasPrefix(string(rr.Key), c.prefix) {
			return nil, false
		}
		keys = append(keys, string(rr.Key))
	}
	return keys, true
}

func (c *recheckCtl) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	keys, ok := c.match(req)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c.mu.Lock()
	if !c.armed {
		c.mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c.seen++
	fail := c.fail > 0
	if fail {
		c.fail--
	}
	hold := !fail && c.hold
	c.mu.Unlock()
	if fail {
		return errors.New("injected: recheck read failed")
	}
	if hold {
		h := &heldRead{keys: keys, release: make(chan error, 1)}
		c.held <- h
		select {
		case err := <-h.release:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *recheckCtl) client(t *testing.T, eps []string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.interceptor)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func (c *recheckCtl) nextHeld(t *testing.T, within time.Duration) *heldRead {
	t.Helper()
	select {
	case h := <-c.held:
		return h
	case <-time.After(within):
		t.Fatalf("no recheck read within %v", within)
		return nil
	}
}

// A recheck read that etcd fails (on the batch's goroutine, not at its
// start) has the watch start over: the deletion made before the watch came
// up still ends the lock.
func TestRecheckFailedOnItsGoroutine(t *testing.T) {
	name := etcdproc.Name(t, "asyncfail")
	ctl := newRecheckCtl(name)
	cli := ctl.client(t, etcd.Endpoints())
	other := etcd.Client(t)
	s := newSession(t, cli)
	ctl.set(true, 1, false)
	l := mustLock(t, s, name)
	if _, err := other.Delete(etcdproc.Ctx(t, 10*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	expectDone(t, l.Done(), 10*time.Second, "lock whose key was deleted, first recheck failed")
	if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
		t.Fatalf("Err = %v", l.Err())
	}
	if n := ctl.count(); n < 2 {
		t.Fatalf("%d recheck reads, want the failed one and another", n)
	}
}

// A held lock's recheck answered only after it was unlocked and the same
// session took the name again: the answer (the new holding's key) must
// not touch the new holding, which must still see its key's deletion.
func TestLateRecheckAfterRelock(t *testing.T) {
	for _, failIt := range []bool{false, true} {
		t.Run(map[bool]string{false: "answered", true: "failed"}[failIt], func(t *testing.T) {
			name := etcdproc.Name(t, "relock")
			ctl := newRecheckCtl(name)
			cli := ctl.client(t, etcd.Endpoints())
			other := etcd.Client(t)
			s := newSession(t, cli)
			batches := lease.TrackRecheckBatches(s)
			ctl.set(true, 0, true)
			l1 := mustLock(t, s, name)
			h := ctl.nextHeld(t, 10*time.Second)
			ctl.set(true, 0, false) // later rechecks go through
			if err := l1.Unlock(etcdproc.Ctx(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			l2 := mustLock(t, s, name)
			if failIt {
				h.release <- errors.New("injected: late failure")
			} else {
				h.release <- nil
			}
			select {
			case <-batches.Idle:
			case <-time.After(10 * time.Second):
				t.Fatal("the held recheck's batch did not end")
			}
			if err := l2.Err(); err != nil {
				t.Fatalf("the new holding ended on the old one's recheck: %v", err)
			}
			if !errors.Is(l1.Err(), lease.ErrUnlocked) {
				t.Fatalf("l1.Err = %v, want ErrUnlocked", l1.Err())
			}
			if _, err := other.Delete(etcdproc.Ctx(t, 10*time.Second), l2.Key()); err != nil {
				t.Fatal(err)
			}
			expectDone(t, l2.Done(), 10*time.Second, "new holding whose key was deleted")
			if !errors.Is(l2.Err(), lease.ErrKeyDeleted) {
				t.Fatalf("l2.Err = %v", l2.Err())
			}
		})
	}
}

// Close while a recheck read is held back: Close returns, nothing leaks.
func TestCloseWithRecheckInFlight(t *testing.T) {
	etcdproc.LeakCheck(t)
	name := etcdproc.Name(t, "close")
	ctl := newRecheckCtl(name)
	cli := ctl.client(t, etcd.Endpoints())
	s, err := lease.NewSession(etcdproc.Ctx(t, 10*time.Second), cli)
	if err != nil {
		t.Fatal(err)
	}
	ctl.set(true, 0, true)
	l := mustLock(t, s, name)
	ctl.nextHeld(t, 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return in 10 s with a recheck held back")
	}
	if !errors.Is(l.Err(), lease.ErrSessionClosed) {
		t.Fatalf("Err = %v", l.Err())
	}
}

// Many held locks on one session, their rechecks failing at random, the
// session's link cut now and then, some keys deleted by another client
// while the watches are down or up, and locks unlocked and taken again:
// every deleted holder ends with ErrKeyDeleted, and no other ends.
func TestRecheckStress(t *testing.T) {
	etcdproc.LeakCheck(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 1))
	link := newCutLink(t)
	prefix := etcdproc.Name(t, "stress")
	ctl := newRecheckCtl(prefix)
	var fmu sync.Mutex
	failPct := 0
	frnd := rand.New(rand.NewPCG(uint64(seed), 2))
	inner := ctl.interceptor
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{link.url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if _, ok := ctl.match(req); ok {
				fmu.Lock()
				fail := frnd.IntN(100) < failPct
				fmu.Unlock()
				if fail {
					return errors.New("injected: random recheck failure")
				}
			}
			return inner(ctx, method, req, reply, cc, invoker, opts...)
		})}})
	if err != nil {
		t.Fatal(err)
	}
	other := etcd.Client(t)
	// Each cut drops the client's connection, and gRPC reconnects with a
	// backoff of its own: twelve in a row on a loaded machine kept the
	// session from renewing a 10 s lease in time once (CI, Go 1.27 leg).
	s, err := lease.NewSession(etcdproc.Ctx(t, 10*time.Second), cli, lease.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close(); cli.Close() }()
	const names = 12
	held := make([]*lease.Lock, names)
	deleted := map[*lease.Lock]bool{}
	ctx := etcdproc.Ctx(t, 5*time.Minute)
	for round := 0; round < 12; round++ {
		fmu.Lock()
		failPct = []int{0, 30, 60, 90}[rnd.IntN(4)]
		fmu.Unlock()
		for i := range held {
			switch {
			case held[i] == nil || held[i].Err() != nil:
				l, err := s.Lock(ctx, fmt.Sprintf("%s/%d", prefix, i))
				if err != nil {
					t.Fatalf("round %d: lock %d: %v", round, i, err)
				}
				held[i] = l
			case rnd.IntN(4) == 0:
				if err := held[i].Unlock(ctx); err != nil {
					t.Fatalf("round %d: unlock %d: %v", round, i, err)
				}
				l, err := s.Lock(ctx, fmt.Sprintf("%s/%d", prefix, i))
				if err != nil {
					t.Fatalf("round %d: relock %d: %v", round, i, err)
				}
				held[i] = l
			}
		}
		// Some deletions at once, some after a cut of the link.
		cut := rnd.IntN(2) == 0
		if cut {
			link.cut()
		}
		if d := rnd.IntN(5); d > 0 {
			time.Sleep(time.Duration(d) * 20 * time.Millisecond) // let some own-key watches come up, or not
		}
		var victims []*lease.Lock
		for i := range held {
			if rnd.IntN(5) == 0 {
				victims = append(victims, held[i])
				if _, err := other.Delete(ctx, held[i].Key()); err != nil {
					t.Fatal(err)
				}
				deleted[held[i]] = true
			}
		}
		if cut {
			link.mend(t)
		}
		fmu.Lock()
		failPct = 0 // rechecks must get through in the end
		fmu.Unlock()
		for _, l := range victims {
			select {
			case <-l.Done():
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d (cut %v): %s not ended 20 s after its key was deleted", round, cut, l.Key())
			}
			if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
				t.Fatalf("round %d: %s: Err = %v", round, l.Key(), l.Err())
			}
		}
		for i, l := range held {
			if deleted[l] {
				continue
			}
			if err := l.Err(); err != nil {
				t.Fatalf("round %d: lock %d (%s) ended though its key was not deleted: %v", round, i, l.Key(), err)
			}
		}
	}
	// Every live holder's key is still its own in etcd.
	for i, l := range held {
		if deleted[l] {
			continue
		}
		resp, err := other.Get(ctx, l.Key())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != l.Token() {
			t.Fatalf("lock %d: key %s not its own in etcd: %v", i, l.Key(), resp.Kvs)
		}
	}
}

// Through a Keeper's session: the link cut, the key deleted meanwhile,
// the first rechecks as the link comes back failing.
func TestRecheckKeeperCut(t *testing.T) {
	etcdproc.LeakCheck(t)
	link := newCutLink(t)
	name := etcdproc.Name(t, "keeper-cut")
	ctl := newRecheckCtl(name)
	cli := ctl.client(t, []string{link.url})
	other := etcd.Client(t)
	k, err := lease.NewKeeper(cli)
	if err != nil {
		t.Fatal(err)
	}
	s, err := lease.NewSession(etcdproc.Ctx(t, 10*time.Second), cli, lease.WithKeeper(k), lease.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); k.Close(); cli.Close() })
	l := mustLock(t, s, name)
	link.cut()
	if _, err := other.Delete(etcdproc.Ctx(t, 10*time.Second), l.Key()); err != nil {
		t.Fatal(err)
	}
	ctl.set(true, 2, false)
	link.mend(t)
	t.Cleanup(func() { s.Close(); k.Close(); cli.Close() })
	expectDone(t, l.Done(), 20*time.Second, "lock whose key was deleted while the link was cut")
	if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
		t.Fatalf("Err = %v", l.Err())
	}
	t.Logf("%d rechecks seen", ctl.count())
}
