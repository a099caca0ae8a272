package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// TestForeignKeysBesideLock: keys under a lock's name that are not places
// in its queue (a data key, a key with no lease, a key named after a lease
// it is not attached to) are ignored by Lock, TryLock, Campaign,
// CurrentLeader and Observe. Each is written before any lock key, so it is
// the oldest key under the name.
func TestForeignKeysBesideLock(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	grant := func() clientv3.LeaseID {
		resp, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 30)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Revoke(context.Background(), resp.ID) })
		return resp.ID
	}
	other, another := grant(), grant()
	cases := []foreignKey{
		{"data key without lease", func(n string) string { return n + "/checkpoint" }, 0},
		{"data key with a lease", func(n string) string { return n + "/fence" }, other},
		{"lease-named key without lease", func(n string) string { return fmt.Sprintf("%s/%x", n, int64(other)) }, 0},
		{"lease-named key on another lease", func(n string) string { return fmt.Sprintf("%s/%x", n, int64(other)) }, another},
	}
	for _, tc := range cases {
		for _, keeper := range []bool{false, true} {
			testForeignKey(t, cli, tc, keeper)
		}
	}
}

// foreignKey is a key under a lock's name that is not a place in its queue.
type foreignKey struct {
	name  string
	key   func(name string) string
	lease clientv3.LeaseID
}

// testForeignKey is one case of TestForeignKeysBesideLock, with sessions of
// their own or (keeper) through a Keeper, whose copy of the queue must
// ignore the foreign key too.
func testForeignKey(t *testing.T, cli *clientv3.Client, tc foreignKey, keeper bool) {
	sub := tc.name
	if keeper {
		sub += " (keeper)"
	}
	t.Run(sub, func(t *testing.T) {
		name := etcdproc.Name(t, "foreign")
		var opts []clientv3.OpOption
		if tc.lease != 0 {
			opts = append(opts, clientv3.WithLease(tc.lease))
		}
		if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), tc.key(name), "user data", opts...); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 10*time.Second)
		defer cancel()
		var sopts []lease.Option
		if keeper {
			sopts = append(sopts, lease.WithKeeper(newKeeper(t, cli)))
		}
		s1, s2 := newSession(t, cli, sopts...), newSession(t, cli, sopts...)

		// Lock, a waiter behind it, handoff: nobody waits on the data key.
		first, err := s1.Lock(ctx, name)
		if err != nil {
			t.Fatalf("Lock with %s beside it: %v", tc.name, err)
		}
		granted := make(chan error, 1)
		go func() {
			l, err := s2.Lock(ctx, name)
			if err == nil {
				err = l.Unlock(ctx)
			}
			granted <- err
		}()
		if err := first.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-granted; err != nil {
			t.Fatalf("second Lock after the first release: %v", err)
		}
		// TryLock on a name with only the data key.
		tl, err := s1.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		if err := tl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Election: the data key is never the leader.
		if _, err := lease.CurrentLeader(ctx, cli, name); err == nil {
			t.Fatalf("CurrentLeader found a leader among %s", tc.name)
		}
		obs, err := lease.Observe(ctx, cli, name)
		if err != nil {
			t.Fatal(err)
		}
		defer obs.Close()
		lead, err := s1.Campaign(ctx, name, "s1")
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		ld, err := lease.CurrentLeader(ctx, cli, name)
		if err != nil || ld.Key != lead.Key() {
			t.Fatalf("CurrentLeader = %+v, %v; want %s", ld, err, lead.Key())
		}
		select {
		case ld := <-obs.Leaders():
			if ld.Key != lead.Key() {
				t.Fatalf("Observe delivered %s, want %s", ld.Key, lead.Key())
			}
		case <-ctx.Done():
			t.Fatal("Observe delivered no leader")
		}
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if v, err := cli.Get(ctx, tc.key(name)); err != nil || len(v.Kvs) != 1 {
			t.Fatalf("the data key is gone: %v %v", v, err)
		}
	})
}
