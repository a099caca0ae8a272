package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// A waiter's Lock ends by its ctx; etcd, overloaded, answers the cleanup
// "too many requests": refused before it was proposed, but only for now.
// The cleanup tries again, so the key does not stay queued on the live
// lease ahead of every later waiter (a review of issue 46 found it given
// up).
func TestCleanupRetriesWhenOverloaded(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	o := newSession(t, cli)
	p := newSession(t, cli)
	name := etcdproc.Name(t, "cleanup-overloaded")
	held := mustLock(t, o, name)
	// The second key write is the cleanup, after the enqueue put.
	kv := &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate { return map[int]fate{1: overloaded}[n] }}
	lease.SetKeys(s, kv)
	ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 300*time.Millisecond)
	_, err := s.Lock(ctx, name)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the waiter's Lock: %v, want its ctx's end", err)
	}
	if n := kv.commits(); n < 3 {
		t.Fatalf("%d key writes: the refused cleanup was not sent again", n)
	}
	if err := held.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 2*time.Second)
	defer cancel()
	if l, err := p.Lock(ctx, name); err != nil {
		t.Errorf("orphan: another session cannot take the free name: %v; keys %v", err, queueKeys(t, cli, name))
	} else {
		_ = l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	}
}

// The same for the withdrawal: a put applies, its answer is lost, and
// etcd answers the withdrawal "too many requests": it is sent again and
// removes the key, so another session takes the free name.
func TestWithdrawalRetriesWhenOverloaded(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	s := newSession(t, cli)
	p := newSession(t, cli)
	name := etcdproc.Name(t, "withdraw-overloaded")
	lease.SetKeys(s, &lossyKV{KV: cli, decide: func(n int, _ *heldTxn) fate {
		return map[int]fate{0: loseAnswer, 1: overloaded}[n]
	}})
	if _, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name); err == nil {
		t.Fatal("granted")
	}
	ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 2*time.Second)
	defer cancel()
	if l, err := p.Lock(ctx, name); err != nil {
		t.Errorf("orphan: another session cannot take the free name: %v; keys %v", err, queueKeys(t, cli, name))
	} else {
		_ = l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	}
}

// Concurrent Lock, RLock and Campaign calls on one name through one
// session, their key writes lossy, with the session's own locks ending by
// ctx: they take turns through the gate. After every call no two holdings
// are alive at once; at the end, with everything replayed, the session
// takes the name and leaves no key under it.
func TestConcurrentSameNameLossy(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	const rounds = 6
	for round := range rounds {
		s := newSession(t, cli)
		name := etcdproc.Name(t, fmt.Sprintf("concurrent-lossy-%d", round))
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		lossy := true
		kv := &lossyKV{KV: cli, decide: func(int, *heldTxn) fate {
			mu.Lock()
			defer mu.Unlock()
			if !lossy {
				return pass
			}
			switch rng.IntN(6) {
			case 0:
				return loseAnswer
			case 1:
				return hold
			}
			return pass
		}}
		lease.SetKeys(s, kv)
		var live atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for g := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 5 {
					ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), time.Duration(50+50*((g+i)%3))*time.Millisecond)
					var l *lease.Lock
					var err error
					switch (g + i) % 3 {
					case 0:
						l, err = s.Lock(ctx, name)
					case 1:
						l, err = s.RLock(ctx, name)
					default:
						var e *lease.Leadership
						if e, err = s.Campaign(ctx, name, "v"); err == nil {
							l = e.Lock()
						}
					}
					cancel()
					if err != nil {
						if !errors.Is(err, errAnswerLost) && !errors.Is(err, context.DeadlineExceeded) {
							errs <- fmt.Errorf("goroutine %d call %d: %w", g, i, err)
						}
						continue
					}
					if n := live.Add(1); n != 1 {
						errs <- fmt.Errorf("%d holdings of one name through one session at once", n)
					}
					resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), l.Key())
					if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != l.Token() {
						errs <- fmt.Errorf("granted %s@%d but its key is %v (%v)", l.Key(), l.Token(), resp, err)
					}
					time.Sleep(5 * time.Millisecond)
					live.Add(-1)
					for range 3 {
						if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err == nil || !errors.Is(err, errAnswerLost) {
							break
						}
					}
					select {
					case <-l.Done():
					case <-time.After(3 * time.Second):
						// Its Unlock never answered: replay, as a late apply would.
						mu.Lock()
						kv.replay(t)
						mu.Unlock()
						select {
						case <-l.Done():
						case <-time.After(3 * time.Second):
							errs <- fmt.Errorf("a holding whose Unlocks had no answer never ended")
							_ = l.Unlock(etcdproc.Ctx(t, 30*time.Second))
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		mu.Lock()
		lossy = false
		mu.Unlock()
		kv.replay(t)
		l, err := s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
		if err != nil {
			t.Errorf("round %d: stranded: %v; keys %v", round, err, queueKeys(t, cli, name))
			continue
		}
		if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if keys := queueKeys(t, cli, name); len(keys) != 0 {
			t.Errorf("round %d: orphan: %v", round, keys)
		}
	}
}
