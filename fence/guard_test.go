package fence_test

import (
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// HeldCmps check what Held checks: a live holder passes, and a holder
// whose key someone else's put moved off its lease fails, although the
// key keeps its creation revision (the one comparison the old Cmp made,
// which this test shows still holds).
func TestHeldCmpsRefuseKeyOffItsLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, other := etcd.Client(t), etcd.Client(t)
	name := etcdproc.Name(t, "heldcmps")
	data := name + "-data"
	_, live := newLock(t, cli, name+"-live")
	_, moved := newLock(t, cli, name+"-moved")

	commit := func(h fence.Holder, cmps []clientv3.Cmp, value string) bool {
		t.Helper()
		resp, err := cli.Txn(testCtx(t)).If(cmps...).Then(clientv3.OpPut(data, value)).Commit()
		if err != nil {
			t.Fatalf("txn for %s@%d: %v", h.Key(), h.Token(), err)
		}
		return resp.Succeeded
	}
	if !commit(live, fence.HeldCmps(live), "live") {
		t.Fatal("HeldCmps refused a live holder")
	}

	// Another client's put with no lease: the key stays, with its creation
	// revision, off the holder's lease.
	if _, err := other.Put(testCtx(t), moved.Key(), "intruder"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(testCtx(t), moved.Key())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != moved.Token() || resp.Kvs[0].Lease != 0 {
		t.Fatalf("moved key: %v %v, want creation revision %d and no lease", resp.Kvs, err, moved.Token())
	}
	// A bare holder: the verdict is etcd's, not the Lock's own Err.
	bare := token{moved.Key(), moved.Token()}
	revOnly := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(bare.Key()), "=", bare.Token())}
	if !commit(bare, revOnly, "unchanged") {
		t.Fatal("setup: the creation revision alone no longer holds, so the test would not tell the lease check apart")
	}
	if commit(bare, fence.HeldCmps(bare), "moved") {
		t.Fatal("HeldCmps passed a holder whose key was moved off its lease")
	}
	if v, _ := get(t, cli, data); v != "unchanged" {
		t.Fatalf("data = %q after the refused write, want unchanged", v)
	}
	// Held refuses the same key: one verdict for both.
	_, err = fence.NewTxn(testCtx(t), cli, fence.Held(bare)).Then(clientv3.OpPut(data, "held")).Commit()
	var nh *fence.NotHeldError
	if !errors.As(err, &nh) || !nh.Detached {
		t.Fatalf("Held on the moved key: %v, want a Detached NotHeldError", err)
	}
	if !commit(live, fence.HeldCmps(live), "live again") {
		t.Fatal("HeldCmps refused the live holder after another key moved")
	}
}

// A token that is not positive never passes, even for a missing key,
// whose creation revision reads as 0.
func TestHeldCmpsRefuseZeroToken(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "heldcmps-zero")
	h := token{name + "/missing", 0}
	resp, err := cli.Txn(testCtx(t)).If(fence.HeldCmps(h)...).Then(clientv3.OpPut(name+"-data", "x")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("HeldCmps with token 0 on a missing key: succeeded=%v err=%v", resp != nil && resp.Succeeded, err)
	}
}
