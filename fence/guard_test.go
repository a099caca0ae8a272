package fence_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
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
		resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).If(cmps...).Then(clientv3.OpPut(data, value)).Commit()
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
	if _, err := other.Put(etcdproc.Ctx(t, 30*time.Second), moved.Key(), "intruder"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), moved.Key())
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
	_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(bare)).Then(clientv3.OpPut(data, "held")).Commit()
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
	h := token{name + "/1a2b", 0}
	resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).If(fence.HeldCmps(h)...).Then(clientv3.OpPut(name+"-data", "x")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("HeldCmps with token 0 on a missing key: succeeded=%v err=%v", resp != nil && resp.Succeeded, err)
	}
}

// The defect this guards against: someone's put moves the holder's key
// onto another live lease. Package lease takes that key for no lock and
// grants the next waiter, so the old holder (paused, its Lock not yet
// told) must be refused by etcd, by Held and HeldCmps alike, while the
// new holder writes. Before the move both pass.
func TestHeldRefusesKeyOnAnotherLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli, other := etcd.Client(t), etcd.Client(t)
	name := etcdproc.Name(t, "held-foreign")
	data := name + "-data"
	_, first := newLock(t, cli, name)
	// The paused old holder: a bare Holder, so that the verdict is etcd's,
	// not the Lock's own Err.
	old := token{first.Key(), first.Token()}
	heldWrite := func(h fence.Holder, value string) error {
		t.Helper()
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h)).Then(clientv3.OpPut(data, value)).Commit()
		return err
	}
	cmpsWrite := func(h fence.Holder, value string) bool {
		t.Helper()
		resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).If(fence.HeldCmps(h)...).Then(clientv3.OpPut(data, value)).Commit()
		if err != nil {
			t.Fatalf("txn for %s@%d: %v", h.Key(), h.Token(), err)
		}
		return resp.Succeeded
	}
	if err := heldWrite(old, "old held"); err != nil {
		t.Fatalf("control: Held before the move: %v", err)
	}
	if !cmpsWrite(old, "old cmps") {
		t.Fatal("control: HeldCmps before the move failed")
	}

	s2, err := lease.NewSession(etcdproc.Ctx(t, 30*time.Second), other)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	type result struct {
		l   *lease.Lock
		err error
	}
	waiter := make(chan result, 1)
	ctx, cancel := testCtxWithTimeout(t, 20*time.Second)
	defer cancel()
	go func() {
		l, err := s2.Lock(ctx, name)
		waiter <- result{l, err}
	}()

	// Someone's put moves the holder's key onto another live lease.
	g, err := other.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Revoke(etcdproc.Ctx(t, 30*time.Second), g.ID)
	if _, err := other.Put(etcdproc.Ctx(t, 30*time.Second), old.Key(), "intruder", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), old.Key())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != old.Token() || resp.Kvs[0].Lease != int64(g.ID) {
		t.Fatalf("moved key: %v %v, want creation revision %d on lease %x", resp.Kvs, err, old.Token(), int64(g.ID))
	}
	ttl, err := cli.TimeToLive(etcdproc.Ctx(t, 30*time.Second), g.ID)
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("the other lease is not live: %v %v", ttl, err)
	}

	r := <-waiter
	if r.err != nil {
		t.Fatalf("the waiter behind the moved key: %v, want the lock", r.err)
	}
	next := r.l
	if next.Token() <= old.Token() {
		t.Fatalf("new holder's token %d, not above the old %d", next.Token(), old.Token())
	}
	if err := heldWrite(next, "new"); err != nil {
		t.Fatalf("the new holder's Held write: %v", err)
	}

	err = heldWrite(old, "old after the move")
	var nh *fence.NotHeldError
	if !errors.Is(err, fence.ErrNotHeld) || !errors.As(err, &nh) || !nh.Detached || nh.Current != old.Token() {
		t.Fatalf("Held on the key moved onto another lease: %v, want a Detached NotHeldError", err)
	}
	if cmpsWrite(old, "old cmps after the move") {
		t.Fatal("HeldCmps passed a holder whose key was moved onto another lease")
	}
	if v, _ := get(t, cli, data); v != "new" {
		t.Fatalf("data = %q, want the new holder's write alone", v)
	}
	if !cmpsWrite(next, "new cmps") {
		t.Fatal("HeldCmps refused the new holder")
	}
	if err := next.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A Holder whose key is not in etcd's lock layout (name, "/", the lease
// ID in lowercase hex) is refused by Held as bad input, with nothing
// sent, even when the key exists on a lease with that creation revision;
// HeldCmps on it never hold.
func TestHeldRefusesKeyWithNoLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "held-nolease")
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(etcdproc.Ctx(t, 30*time.Second), g.ID)
	hex := fmt.Sprintf("%x", int64(g.ID))
	keys := []string{
		strings.ReplaceAll(name, "/", "-") + hex, // no "/"
		name + "/",
		name + "/lock",
		name + "/0" + hex,
		name + "/+" + hex,
		name + "/-" + hex,
		name + "/0",
		name + "/8000000000000000", // past int64
		name + "/" + hex + "/x",
	}
	if up := strings.ToUpper(hex); up != hex {
		keys = append(keys, name+"/"+up)
	}
	for _, key := range keys {
		t.Run(key[len(name):], func(t *testing.T) {
			p, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), key, "", clientv3.WithLease(g.ID))
			if err != nil {
				t.Fatal(err)
			}
			h := token{key, p.Header.Revision}
			kv := &countingKV{KV: cli}
			before := revision(t, cli)
			_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, fence.Held(h)).Then(clientv3.OpPut(name+"-data", "x")).Commit()
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("Held on %q: %v, want ErrInvalidArgument", key, err)
			}
			if kv.sent != 0 || revision(t, cli) != before {
				t.Fatalf("Held on %q sent %d transactions", key, kv.sent)
			}
			resp, err := cli.Txn(etcdproc.Ctx(t, 30*time.Second)).If(fence.HeldCmps(h)...).Then(clientv3.OpPut(name+"-data", "x")).Commit()
			if err != nil || resp.Succeeded {
				t.Fatalf("HeldCmps on %q: succeeded=%v err=%v, want a failed comparison", key, resp != nil && resp.Succeeded, err)
			}
			if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), key); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Held on a lock key that someone else's put moved off its lease, onto
// another live lease and then onto none: the key keeps its creation
// revision both times, and Held refuses it with Detached set, in the
// Held-only shape and beside a Claim (one-level shape), changing nothing.
func TestHeldRefusesDetachedKey(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	h, _ := lockPut(t, cli, etcdproc.Name(t, "held-detached")+"/lock")
	lock := h.key
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(etcdproc.Ctx(t, 30*time.Second), g.ID)
	refused := func(how string) {
		t.Helper()
		for _, guards := range [][]fence.Guard{{fence.Held(h)}, {fence.Held(h), fence.Claim(lock+"-fence", 3)}} {
			before := revision(t, cli)
			_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, guards...).Then(clientv3.OpPut(lock+"-data", "y")).Commit()
			var nh *fence.NotHeldError
			if !errors.As(err, &nh) || !nh.Detached || nh.Current != h.tok {
				t.Fatalf("Held on a key moved onto %s (%v): %v, want a Detached NotHeldError", how, guards, err)
			}
			if revision(t, cli) != before {
				t.Fatalf("a refused transaction (key on %s) changed the store", how)
			}
		}
	}
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), lock, "", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	refused("another lease")
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), lock, ""); err != nil {
		t.Fatal(err)
	}
	refused("no lease")
}
