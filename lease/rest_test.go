package lease_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// Once a name is no longer contended, its queue watch rests: after a
// round of contention has opened it, a session that locks and releases
// the name alone again and again is sent no event after the first few
// locks, on a session's own watch as through a Keeper (whose watch also
// carries every put, for its copy of the queue), nor, once its own-key
// watch rests too, its own Unlock's deletion. A holder still hears of its
// key's deletion, and the next lock that has to wait opens the watches
// again and is granted after the holder, in token order.
func TestQueueWatchRestsWhileUncontended(t *testing.T) {
	etcdproc.LeakCheck(t)
	for _, keeper := range []bool{false, true} {
		t.Run(fmt.Sprintf("keeper=%v", keeper), func(t *testing.T) {
			name := etcdproc.Name(t, "rest")
			events := watchEventsUnder(name + "/")
			cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(events.interceptor)}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cli.Close() })
			var opts []lease.Option
			if keeper {
				opts = append(opts, lease.WithKeeper(newKeeper(t, cli)))
			}
			queued := make(chan struct{}, 1)
			hooks := &lease.Hooks{Waiting: func(_ string, delta int) {
				if delta > 0 {
					queued <- struct{}{}
				}
			}}
			a := newSession(t, cli, append(opts, lease.WithHooks(hooks))...)
			b := newSession(t, cli, append(opts, lease.WithHooks(hooks))...)

			// Contention opens the queue watches: b waits behind a.
			waitBehind(t, a, b, name, queued)

			// b alone, again and again: the first locks still hear their
			// own Unlock (and, through a Keeper, their put); the last
			// ones are sent nothing.
			const warm, quiet = 16, 16
			cycle := func() {
				l := mustLock(t, b, name)
				if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			before := events.n.Load()
			for range warm {
				cycle()
			}
			atWarm := events.n.Load()
			for range quiet {
				cycle()
			}
			t.Logf("events: %d in the first %d locks alone, %d in the next %d", atWarm-before, warm, events.n.Load()-atWarm, quiet)
			if atWarm == before {
				t.Errorf("no event in the first %d locks alone: the watch was not open, the test shows nothing", warm)
			}
			if got := events.n.Load() - atWarm; got != 0 {
				t.Errorf("%d watch events in %d locks alone after %d, want none: the queue watch did not rest", got, quiet, warm)
			}

			// With the watches at rest, a holder still hears of its key's
			// deletion, once it has held for a moment (the own-key watch
			// opens again then).
			l := mustLock(t, b, name)
			if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), l.Key()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Done():
				if !errors.Is(l.Err(), lease.ErrKeyDeleted) {
					t.Errorf("holder whose key was deleted ended with %v, want ErrKeyDeleted", l.Err())
				}
			case <-time.After(2 * time.Second):
				t.Fatal("holder not told of its key's deletion within 2s, with its watches at rest")
			}

			// Contention again, with the watch at rest: a waits behind b
			// and is granted once b releases.
			waitBehind(t, b, a, name, queued)
		})
	}
}

// waitBehind has waiter queue behind a lock of name taken by holder, and
// checks that it is granted once holder releases, with a higher token.
func waitBehind(t *testing.T, holder, waiter *lease.Session, name string, queued <-chan struct{}) {
	t.Helper()
	h := mustLock(t, holder, name)
	ch := lockAsync(etcdproc.Ctx(t, 30*time.Second), waiter, name)
	select {
	case <-queued:
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Fatalf("waiter granted (token %d) while the holder (token %d) held", r.l.Token(), h.Token())
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Fatalf("waiter granted (token %d) while the holder (token %d) held", r.l.Token(), h.Token())
	default:
	}
	if err := h.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.l.Token() <= h.Token() {
			t.Errorf("waiter granted token %d after %d", r.l.Token(), h.Token())
		}
		if err := r.l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	case <-etcdproc.Ctx(t, 30*time.Second).Done():
		t.Fatal("waiter not granted after the holder released")
	}
}
