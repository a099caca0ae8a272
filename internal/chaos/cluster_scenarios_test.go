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
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/internal/exampleenv"
	"github.com/leasefence/leasefence/lease"
)

// Scenario 8: the etcd leader is stopped while a lock is held and written.
// The holder's guarded writes go on after the failover; a contender is not
// granted while the holder's keep-alives succeed; the next token is larger.
func scenarioLeaderStop(t testing.TB, ctx context.Context, c *etcdtest.Cluster) error {
	cli := c.ClientT(t)
	name, reg := etcdtest.Name(t, "failover"), etcdtest.Name(t, "failover-reg")
	hs := session(t, ctx, cli, 5*time.Second)
	holder := lock(t, ctx, hs, name)
	cs := session(t, ctx, c.ClientT(t), 5*time.Second)
	contender := make(chan *lease.Lock, 1)
	go func() {
		l, err := cs.Lock(ctx, name)
		if err != nil {
			l = nil
		}
		contender <- l
	}()
	write := func(v string) error {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := fence.NewTxn(wctx, cli, fence.Held(holder)).Then(clientv3.OpPut(reg, v)).Commit()
		return err
	}
	if err := write("before"); err != nil {
		return fmt.Errorf("write before the failover: %w", err)
	}
	leader := c.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Stop()
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := leader.Restart(rctx); err != nil {
			t.Errorf("restart: %v", err)
		}
	}()
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
	select {
	case l := <-contender:
		if l == nil {
			return errors.New("contender failed")
		}
		defer l.Unlock(ctx)
		if l.Token() <= holder.Token() {
			return fmt.Errorf("token after the failover %d not above %d", l.Token(), holder.Token())
		}
	case <-time.After(10 * time.Second):
		return errors.New("contender not granted 10s after the holder let go")
	}
	return nil
}

// Scenario 9: a holder process is killed with SIGKILL; how long until the
// queued contender is granted.
func scenarioTakeover(t testing.TB, ctx context.Context) (time.Duration, error) {
	cli := etcd.Client(t)
	name := etcdtest.Name(t, "takeover")
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
	got := make(chan *lease.Lock, 1)
	go func() {
		l, err := s.Lock(ctx, name)
		if err != nil {
			l = nil
		}
		got <- l
	}()
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
