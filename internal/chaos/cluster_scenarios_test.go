package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/internal/seam"
	"github.com/leasefence/leasefence/lease"
)

// Scenario 8: the etcd leader is stopped while a lock is held and written.
// The holder's guarded writes go on after the failover; a contender is not
// granted while the holder's keep-alives succeed; the next token is larger.
func scenarioLeaderStop(t testing.TB, ctx context.Context, c *etcdtest.Cluster) error {
	return scenarioLeaderGone(t, ctx, func() *clientv3.Client { return c.ClientT(t) }, func() func() {
		leader := c.Leader()
		if leader == nil {
			t.Fatal("no leader")
		}
		leader.Stop()
		return func() {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := leader.Restart(rctx); err != nil {
				t.Errorf("restart: %v", err)
			}
		}
	})
}

// scenarioLeaderGone is scenario 8 with the leader taken away by stop,
// which returns how to bring it back.
func scenarioLeaderGone(t testing.TB, ctx context.Context, newClient func() *clientv3.Client, stop func() (restart func())) error {
	cli := newClient()
	name, reg := etcdproc.Name(t, "failover"), etcdproc.Name(t, "failover-reg")
	hs := session(t, ctx, cli, 5*time.Second)
	holder := lock(t, ctx, hs, name)
	cs := session(t, ctx, newClient(), 5*time.Second)
	contender := lockLater(ctx, cs, name)
	write := func(v string) error {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := fence.NewTxn(wctx, seam.KV(wctx, cli), fence.Held(holder)).Then(clientv3.OpPut(reg, v)).Commit()
		return err
	}
	if err := write("before"); err != nil {
		return fmt.Errorf("write before the failover: %w", err)
	}
	defer stop()()
	// Writes resume once a new leader is elected; keep trying, bounded.
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for err = write("after"); err != nil && time.Now().Before(deadline); err = write("after") {
		if errors.Is(err, fence.ErrNotHeld) {
			return fmt.Errorf("holder lost the lock in the failover: %w", err)
		}
	}
	if err != nil {
		return fmt.Errorf("no write after the failover: %w", err)
	}
	select {
	case l := <-contender:
		return fmt.Errorf("contender granted (%v) while the holder holds (holder err %v)", l, holder.Err())
	default:
	}
	if holder.Err() != nil {
		return fmt.Errorf("holder lost the lock across the failover: %v", holder.Err())
	}
	holder.Unlock(ctx)
	return grantedAfter(ctx, contender, holder.Token())
}

// Scenario 9: a holder process is killed with SIGKILL; how long until the
// queued contender is granted.
func scenarioTakeover(t testing.TB, ctx context.Context) (time.Duration, error) {
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "takeover")
	c, err := exampleenv.StartChild(ctx, "holder", "holder",
		envEndpoints+"="+strings.Join(etcd.Endpoints(), ","), envLock+"="+name, envTTL+"="+ttl.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	tok, err := c.Expect("LOCKED ", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	childToken, _ := strconv.ParseInt(tok, 10, 64)
	s := session(t, ctx, cli, ttl)
	got := lockLater(ctx, s, name)
	if err := waitQueuedKeys(ctx, cli, name, 2); err != nil {
		t.Fatal(err)
	}
	c.Signal(syscall.SIGKILL)
	killed := time.Now()
	select {
	case l := <-got:
		if l == nil {
			return 0, errors.New("contender failed")
		}
		d := time.Since(killed)
		defer l.Unlock(ctx)
		if l.Token() <= childToken {
			return d, fmt.Errorf("token %d not above the killed holder's %d", l.Token(), childToken)
		}
		return d, nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("no takeover within 10s")
	}
}

// Partition: the peer port of a minority member, with a lock holder's
// client on it, is blackholed (the fault etcd's own functional tests call
// a peer-port blackhole). The member still hears the leader over the
// connections it dialed itself and forwards the holder's keep-alives to
// it, so the lease is rightly kept: nobody else may be granted the lock
// while the holder's keep-alives succeed, and the holder's writes, which
// the cut-off member cannot get committed, must not land behind a
// successor's. After the cut heals the holder writes again; the next
// holder's token is larger.
func scenarioMinorityPartition(t testing.TB, ctx context.Context, c *etcdtest.Cluster) error {
	leader := c.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	var minority *etcdtest.Member
	var majority []string
	for _, m := range c.Members {
		if m != leader && minority == nil {
			minority = m
			continue
		}
		majority = append(majority, m.ClientURL)
	}
	onMinority, err := etcdproc.NewClient([]string{minority.ClientURL})
	if err != nil {
		t.Fatal(err)
	}
	defer onMinority.Close()
	onMajority, err := etcdproc.NewClient(majority)
	if err != nil {
		t.Fatal(err)
	}
	defer onMajority.Close()
	name, reg := etcdproc.Name(t, "partition"), etcdproc.Name(t, "partition-reg")
	la := lock(t, ctx, session(t, ctx, onMinority, ttl), name)
	if err := resourceWrite(ctx, onMinority, reg, la.Token(), "A1"); err != nil {
		return fmt.Errorf("holder's write before the cut: %w", err)
	}
	cs := session(t, ctx, onMajority, ttl)
	contender := lockLater(ctx, cs, name)
	if err := waitQueuedKeys(ctx, onMajority, name, 2); err != nil {
		t.Fatal(err)
	}
	p := minority.PeerProxy()
	p.BlackholeTx()
	p.BlackholeRx()
	healed := false
	heal := func() {
		if !healed {
			p.UnblackholeTx()
			p.UnblackholeRx()
			healed = true
		}
	}
	defer heal()
	// Three TTLs of the cut: the holder writes through the minority.
	var attempts, landed int
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); {
		attempts++
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		if resourceWrite(wctx, onMinority, reg, la.Token(), fmt.Sprintf("A-cut-%d", attempts)) == nil {
			landed++
		}
		cancel()
	}
	select {
	case l := <-contender:
		if l != nil && la.Err() == nil {
			return fmt.Errorf("contender granted token %d while the holder's keep-alives succeed", l.Token())
		}
		if l != nil {
			// The holder's lease did end: its writes must now be refused.
			defer l.Unlock(ctx)
			if err := resourceWrite(ctx, onMajority, reg, l.Token(), "B"); err != nil {
				return fmt.Errorf("successor's write: %w", err)
			}
			heal()
			if err := resourceWrite(ctx, onMinority, reg, la.Token(), "A-late"); !errors.Is(err, fence.ErrStale) {
				return fmt.Errorf("old holder's write after the successor's: %v, want ErrStale", err)
			}
			return nil
		}
	default:
	}
	heal()
	t.Logf("during the cut: holder lock err=%v, %d of %d writes landed", la.Err(), landed, attempts)
	if la.Err() != nil {
		return nil // lost (deadline), and no grant yet: the contender gets it next
	}
	deadline := time.Now().Add(10 * time.Second)
	for resourceWrite(ctx, onMinority, reg, la.Token(), "A2") != nil {
		if time.Now().After(deadline) {
			return errors.New("holder could not write 10s after the cut healed")
		}
	}
	la.Unlock(ctx)
	return grantedAfter(ctx, contender, la.Token())
}

// lockLater takes the lock name on s in the background; the channel gets
// the lock, or nil if Lock failed.
func lockLater(ctx context.Context, s *lease.Session, name string) <-chan *lease.Lock {
	ch := make(chan *lease.Lock, 1)
	go func() {
		l, err := s.Lock(ctx, name)
		if err != nil {
			l = nil
		}
		ch <- l
	}()
	return ch
}

// grantedAfter waits for a contender's grant once the holder with token
// prev has let go, checks that its token is larger, and releases it.
func grantedAfter(ctx context.Context, contender <-chan *lease.Lock, prev int64) error {
	select {
	case l := <-contender:
		if l == nil {
			return errors.New("contender failed")
		}
		defer l.Unlock(ctx)
		if l.Token() <= prev {
			return fmt.Errorf("next token %d not above %d", l.Token(), prev)
		}
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("contender not granted 10s after the holder let go")
	}
}
