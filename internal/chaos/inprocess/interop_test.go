package inprocess_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// etcd's Lock RPC (which etcdctl lock also uses) and this library exclude
// each other.
func TestInteropLockRPC(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "rpc")
	ours := newSession(t, cli)
	rpc := v3lockpb.NewLockClient(cli.ActiveConnection())
	grant, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), grant.ID)

	l := mustLock(t, ours, name)
	short, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 300*time.Millisecond)
	_, err = rpc.Lock(short, &v3lockpb.LockRequest{Name: []byte(name), Lease: int64(grant.ID)})
	cancel()
	if err == nil {
		t.Fatal("Lock RPC granted while we hold the lock")
	}
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := rpc.Lock(etcdproc.Ctx(t, 30*time.Second), &v3lockpb.LockRequest{Name: []byte(name), Lease: int64(grant.ID)})
	if err != nil {
		t.Fatalf("Lock RPC after Unlock: %v", err)
	}
	if _, err := ours.TryLock(etcdproc.Ctx(t, 30*time.Second), name); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("TryLock while the Lock RPC holds: %v, want ErrLocked", err)
	}
	if _, err := rpc.Unlock(etcdproc.Ctx(t, 30*time.Second), &v3lockpb.UnlockRequest{Key: resp.Key}); err != nil {
		t.Fatal(err)
	}
	l2, err := ours.TryLock(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatalf("TryLock after the Lock RPC's unlock: %v", err)
	}
	l2.Unlock(etcdproc.Ctx(t, 30*time.Second))
}

// etcd's Election RPC (server side of the same layout) and this package see
// the same leader and token.
func TestInteropElectionRPC(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "rpc-elect")
	rpc := v3electionpb.NewElectionClient(cli.ActiveConnection())
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), g.ID)
	resp, err := rpc.Campaign(etcdproc.Ctx(t, 30*time.Second), &v3electionpb.CampaignRequest{Name: []byte(name), Lease: int64(g.ID), Value: []byte("rpc")})
	if err != nil {
		t.Fatal(err)
	}
	ld, err := lease.CurrentLeader(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if err != nil || ld.Token != resp.Leader.Rev || ld.Value != "rpc" || ld.Key != string(resp.Leader.Key) {
		t.Fatalf("CurrentLeader = %+v, %v; RPC leader %+v", ld, err, resp.Leader)
	}
	s := newSession(t, cli)
	short, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 300*time.Millisecond)
	_, err = s.Campaign(short, name, "ours")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign while the RPC leads: %v, want a timeout", err)
	}
	if keys := queueKeys(t, cli, name); len(keys) != 1 {
		t.Errorf("failed Campaign left keys: %v", keys)
	}
	if _, err := rpc.Resign(etcdproc.Ctx(t, 30*time.Second), &v3electionpb.ResignRequest{Leader: resp.Leader}); err != nil {
		t.Fatal(err)
	}
	e := mustCampaign(t, s, name, "ours")
	lr, err := rpc.Leader(etcdproc.Ctx(t, 30*time.Second), &v3electionpb.LeaderRequest{Name: []byte(name)})
	if err != nil || lr.Kv.CreateRevision != e.Token() || string(lr.Kv.Value) != "ours" {
		t.Fatalf("Leader RPC = %v, %v; want token %d", lr, err, e.Token())
	}
	e.Resign(etcdproc.Ctx(t, 30*time.Second))
}

// The keys this library keeps for a nested name (its lock-delay record,
// left in etcd after the holding) are in no queue of the parent: etcd's
// Lock RPC (etcdctl lock's server side) and Election RPC on the parent
// see none. Before issue 46 the record sat under the parent's prefix and
// blocked them for good.
func TestInteropOwnKeysOutsideParent(t *testing.T) {
	etcdtest.LeakCheck(t)
	cli := etcd.Client(t)
	parent := etcdproc.Name(t, "rpc-parent")
	s := newSession(t, cli, lease.WithLockDelay(time.Second))
	l := mustLock(t, s, parent+"/child")
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), lease.DelayRecordKey(parent+"/child")); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("no lock-delay record of the child (%v): the test shows nothing", err)
	}
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 5)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), g.ID)
	short, cancel := context.WithTimeout(etcdproc.Ctx(t, 30*time.Second), 3*time.Second)
	defer cancel()
	locked, err := v3lockpb.NewLockClient(cli.ActiveConnection()).Lock(short, &v3lockpb.LockRequest{Name: []byte(parent), Lease: int64(g.ID)})
	if err != nil {
		t.Fatalf("etcd's Lock RPC on the parent: %v", err)
	}
	if _, err := v3lockpb.NewLockClient(cli.ActiveConnection()).Unlock(etcdproc.Ctx(t, 30*time.Second), &v3lockpb.UnlockRequest{Key: locked.Key}); err != nil {
		t.Fatal(err)
	}
	if _, err := v3electionpb.NewElectionClient(cli.ActiveConnection()).Leader(etcdproc.Ctx(t, 30*time.Second), &v3electionpb.LeaderRequest{Name: []byte(parent)}); err == nil {
		t.Fatal("etcd's Election RPC names a leader of the parent")
	}
}
