package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// idleWatch is the package's: how long a name's gate and watches outlive
// its last lock on a session (and a Keeper's queue watch its last session).
const idleWatch = time.Second

// Contenders that come back to a name about when its gate and watches
// (and a Keeper's shared queue watch) are dropped for idleness still take
// it one at a time, in token order: a gate dropped as a lock joins it, or
// made again beside a dropped one, never lets two hold.
func TestLockAcrossIdleExpiry(t *testing.T) {
	etcdproc.LeakCheck(t)
	bothShapes(t, func(t *testing.T, cli *clientv3.Client, newS func() *lease.Session) {
		name := etcdproc.Name(t, "idle-expiry")
		const sessions, rounds = 4, 4
		var mu sync.Mutex
		holding := 0
		var last int64
		var wg sync.WaitGroup
		for i := 0; i < sessions; i++ {
			s := newS()
			wg.Go(func() {
				rnd := rand.New(rand.NewPCG(uint64(i), 27))
				for r := 0; r < rounds; r++ {
					var l *lease.Lock
					var err error
					if (i+r)%3 == 0 {
						l, err = s.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
						if errors.Is(err, lease.ErrLocked) {
							continue
						}
					} else {
						l, err = s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					holding++
					if holding > 1 || l.Token() <= last {
						t.Errorf("granted token %d with %d holding, last token %d", l.Token(), holding, last)
					}
					last = l.Token()
					mu.Unlock()
					if _, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), name+"-data"); err != nil { // a round trip under the lock
						t.Error(err)
					}
					mu.Lock()
					holding--
					mu.Unlock()
					if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
						t.Error(err)
						return
					}
					// Come back about when the idle timers fire: the
					// stagger puts the sessions' returns across it.
					time.Sleep(idleWatch - 30*time.Millisecond + time.Duration(rnd.IntN(60))*time.Millisecond)
				}
			})
		}
		wg.Wait()
		if keys := queueKeys(t, cli, name); len(keys) != 0 {
			t.Errorf("keys left: %v", keys)
		}
	})
}

// Sessions, and then their Keeper, close while locks of fresh names are
// being taken through them (each a first use: a gate and watches made, a
// shared queue watch joined). Every call returns, nothing is left queued
// once the leases are revoked, and no goroutine outlives the Keeper.
func TestCloseWhileGatesOpen(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, keeper := range []bool{false, true} {
		t.Run(map[bool]string{false: "own", true: "keeper"}[keeper], func(t *testing.T) {
			cli := etcd.Client(t)
			var k *lease.Keeper
			var opts []lease.Option
			if keeper {
				var err error
				if k, err = lease.NewKeeper(cli); err != nil {
					t.Fatal(err)
				}
				opts = append(opts, lease.WithKeeper(k))
			}
			base := etcdproc.Name(t, "close-gates")
			const sessions, lockers = 4, 6
			var ss []*lease.Session
			for i := 0; i < sessions; i++ {
				s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, opts...)
				if err != nil {
					t.Fatal(err)
				}
				ss = append(ss, s)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			started := make(chan struct{}, sessions*lockers)
			var wg sync.WaitGroup
			for i, s := range ss {
				for j := 0; j < lockers; j++ {
					wg.Go(func() {
						for n := 0; ; n++ {
							// A shared name now and then, so that sessions
							// of a Keeper join one queue watch.
							name := fmt.Sprintf("%s/%d-%d-%d", base, i, j, n)
							if n%3 == 0 {
								name = fmt.Sprintf("%s/shared-%d", base, n)
							}
							l, err := s.Lock(ctx, name)
							if n == 1 {
								started <- struct{}{}
							}
							if err != nil {
								if !errors.Is(err, lease.ErrSessionClosed) {
									t.Errorf("Lock: %v", err)
								}
								return
							}
							l.Unlock(ctx)
						}
					})
				}
			}
			for i := 0; i < sessions*lockers; i++ {
				<-started
			}
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				for i, s := range ss {
					if keeper && i%2 == 1 {
						continue // left for the Keeper's Close
					}
					s.Close()
				}
				if keeper {
					if err := k.Close(); err != nil {
						t.Errorf("Keeper Close: %v", err)
					}
				}
			}()
			select {
			case <-closed:
			case <-ctx.Done():
				t.Fatal("Close hung while locks were being taken")
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("a Lock call hung after its session closed")
			}
			for _, s := range ss {
				s.Close()
			}
			resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), base+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Count != 0 {
				t.Errorf("%d keys left under the names after Close", resp.Count)
			}
		})
	}
}
