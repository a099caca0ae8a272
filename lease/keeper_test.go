package lease_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
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
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	name := etcdproc.Name(t, "keeper")
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
		ttl, err := cli.TimeToLive(etcdproc.Ctx(t, 30*time.Second), s.Lease())
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("session %d: lease not alive after 2×TTL: %v %v", i, ttl, err)
		}
		if !s.Deadline().After(time.Now()) {
			t.Errorf("session %d: deadline %v in the past", i, s.Deadline())
		}
	}
	if _, err := cli.Revoke(etcdproc.Ctx(t, 30*time.Second), sessions[3].Lease()); err != nil {
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
// at its own deadline, the loss margin ahead of etcd's expiry.
func TestKeeperLossWithSilentNetwork(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	k := newKeeper(t, viaProxy)
	const n = 3
	var sessions []*lease.Session
	var locks []*lease.Lock
	for i := 0; i < n; i++ {
		s := newSession(t, viaProxy, lease.WithTTL(shortTTL), lease.WithKeeper(k))
		sessions = append(sessions, s)
		locks = append(locks, mustLock(t, s, etcdproc.Name(t, "keeper-silent")))
	}
	deleted := make([]<-chan time.Time, n)
	lost := make([]chan time.Time, n)
	for i, l := range locks {
		deleted[i], lost[i] = watchDelete(t, cli, l), make(chan time.Time, 1)
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
		checkLossAhead(t, sessions[i], at, deleted[i])
	}
}

// Bad input is refused before anything is sent; Close closes the sessions
// still renewed through the Keeper.
func TestKeeperInputAndClose(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, other := etcd.Client(t), etcd.Client(t)
	if _, err := lease.NewKeeper(nil); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("NewKeeper(nil): %v", err)
	}
	if _, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, lease.WithKeeper(nil)); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("WithKeeper(nil): %v", err)
	}
	k, err := lease.NewKeeper(cli)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), other, lease.WithKeeper(k)); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("a Keeper of another client: %v", err)
	}
	s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, lease.WithKeeper(k))
	if err != nil {
		t.Fatal(err)
	}
	l := mustLock(t, s, etcdproc.Name(t, "keeper-close"))
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	expectDone(t, l.Done(), time.Second, "a lock of a session whose Keeper closed")
	if !errors.Is(l.Err(), lease.ErrSessionClosed) {
		t.Errorf("Err() = %v, want ErrSessionClosed", l.Err())
	}
	if _, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), cli, lease.WithKeeper(k)); !errors.Is(err, lease.ErrSessionClosed) {
		t.Errorf("NewSession with a closed Keeper: %v", err)
	}
	if err := k.Close(); !errors.Is(err, lease.ErrSessionClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// A waiter queued through a Keeper still sees its own key vanish at once
// (exclusivity and token order through a Keeper: TestQueueChurn).
func TestKeeperSharedQueue(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	k := newKeeper(t, cli)
	name := etcdproc.Name(t, "keeper-queue")
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
		_, err := waiter.Lock(etcdproc.Ctx(t, 30*time.Second), name)
		res <- err
	}()
	<-queued // its key is put and it waits
	key := name + "/" + fmt.Sprintf("%x", int64(waiter.Lease()))
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), key); err != nil {
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

// Waiters that give up in the middle of the queue, and readers among
// writers, keep the lock exclusive: a writer never holds it with anyone
// else, readers only with readers, and every writer's token is above those
// of the holdings before it. Through a Keeper, its copy of the queue wakes
// only the waiters a deletion grants; through sessions of their own,
// waiters near the head follow every deletion and those further back (a
// reader behind a writer with a crowd ahead) the two newest keys ahead. A waiter
// left unwoken would hang here, and one woken too early would overlap.
func TestQueueChurn(t *testing.T) {
	etcdproc.LeakCheck(t)
	bothShapes(t, queueChurn)
}

func queueChurn(t *testing.T, cli *clientv3.Client, newS func() *lease.Session) {
	name := etcdproc.Name(t, "queue-churn")
	const sessions, rounds = 10, 20
	var mu sync.Mutex
	writers, readers := 0, 0
	var last int64
	var gaveUp, readersTogether atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < sessions; i++ {
		s := newS()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx := etcdproc.Ctx(t, 30*time.Second)
				giveUp := (i+r)%4 == 3 // gives up while queued, mostly
				if giveUp {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Duration(1+(i*r)%3)*time.Millisecond)
					defer cancel()
				}
				read := (i+2*r)%3 == 0
				var l *lease.Lock
				var err error
				if read {
					l, err = s.RLock(ctx, name)
				} else {
					l, err = s.Lock(ctx, name)
				}
				if err != nil {
					if giveUp && errors.Is(err, context.DeadlineExceeded) {
						gaveUp.Add(1)
						continue
					}
					t.Error(err)
					return
				}
				mu.Lock()
				switch {
				case read && writers > 0, !read && writers+readers > 0:
					t.Errorf("read=%v granted with %d writers and %d readers holding", read, writers, readers)
				case !read && l.Token() <= last:
					t.Errorf("writer token %d after %d", l.Token(), last)
				}
				if read {
					readers++
					if readers > 1 {
						readersTogether.Add(1)
					}
				} else {
					writers++
				}
				last = max(last, l.Token())
				mu.Unlock()
				// Hold it for a fenced write's round trip.
				if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(l)).Then(clientv3.OpPut(name+"-data", "x")).Commit(); err != nil {
					t.Error(err)
				}
				mu.Lock()
				if read {
					readers--
				} else {
					writers--
				}
				mu.Unlock()
				if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d gave up while queued, %d times readers held together", gaveUp.Load(), readersTogether.Load())
	if gaveUp.Load() == 0 || readersTogether.Load() == 0 {
		t.Errorf("the churn did not happen: %d gave up, readers held together %d times", gaveUp.Load(), readersTogether.Load())
	}
}

// A keep-alive send that blocks (etcd not reading the stream, whose flow
// control then holds the sender) holds up neither the deadline checks nor
// the Keeper's sessions: each one still reports its loss by its own local
// deadline, and Close does not wait on the send. The sessions are many so
// that one round of keep-alives (15 bytes each) overfills what gRPC lets a
// stream queue unsent (64 KiB); large puts first use up the connection's
// window, so that nothing of the stream's is written either. The test
// checks that the send did block. With the send back on the loop, or under
// the renewer's mutex, no session is lost in time.
func TestKeeperStalledSend(t *testing.T) {
	if raceDetector {
		// Embedded, etcd runs under the detector too, and falls behind
		// with the renewals of this many sessions: some leases expire,
		// and etcd holds the stream up until it has revoked them.
		t.Skip("too many sessions for etcd under the race detector")
	}
	etcdproc.LeakCheck(t)
	// A member of its own, without fsync: thousands of grants in a second.
	c := etcdproc.StartT(t, etcdproc.Config{NoFsync: true})
	p, viaProxy, _ := etcdproc.ProxiedClient(t, c.Endpoints()[0])
	k := newKeeper(t, viaProxy)
	const n = 5500
	sessions := make([]*lease.Session, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 256 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && !t.Failed(); i = int(next.Add(1) - 1) {
				s, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), viaProxy, lease.WithTTL(shortTTL), lease.WithKeeper(k))
				if err != nil {
					t.Error(err)
					return
				}
				sessions[i] = s
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The grants slow etcd's answers to keep-alives down: wait until it
	// has caught up, so that every session sends a round before its
	// deadline.
	for made := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		behind := 0
		for _, s := range sessions {
			if time.Until(s.Deadline()) < s.TTL()/2 {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if time.Since(made) > 10*time.Second {
			t.Fatalf("%d sessions still behind with their renewals 10s after they were made", behind)
		}
	}
	p.PauseTx()
	t.Cleanup(p.UnpauseTx) // before k.Close, which may revoke
	paused := time.Now()
	pctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	for range 4 {
		wg.Go(func() { viaProxy.Put(pctx, etcdproc.Name(t, "stalled-send"), strings.Repeat("x", 1<<18)) })
	}
	defer wg.Wait()
	defer cancel()
	// Every deadline was set from a keep-alive sent before the pause.
	time.Sleep(time.Until(paused.Add(sessions[0].TTL() + time.Second)))
	for i, s := range sessions {
		if !errors.Is(s.Err(), lease.ErrLeaseExpired) {
			t.Fatalf("session %d, its keep-alives stalled, not lost 1s after its deadline: Err() = %v", i, s.Err())
		}
	}
	buf := make([]byte, 1<<24)
	stacks := string(buf[:runtime.Stack(buf, true)])
	stalled := false
	for _, g := range strings.Split(stacks, "\n\n") {
		stalled = stalled || strings.Contains(g, "renew.(*Renewer).send") && strings.Contains(g, "(*writeQuota).get")
	}
	if !stalled {
		t.Fatal("the Keeper's sender is not blocked in a send: the test did not stall it")
	}
	closed := make(chan error, 1)
	go func() { closed <- k.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Keeper.Close still waiting 5s after every session was lost")
	}
}
