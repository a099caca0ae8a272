package fence_test

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// The gap a claim closes, with the tokens of two real holdings of one
// lock: A (the older token) has a write in flight when B takes the lock
// and reads. With a plain read, A's late write lands after B's read and
// B's own write then moves the state back; with a claim in the read's
// transaction, A's late write is refused.
func TestClaimClosesReadGap(t *testing.T) {
	cases := []struct {
		name   string
		resume func(t *testing.T, cli *clientv3.Client, rec, data string, token int64) string
		late   func(t *testing.T, err error)
		final  string
	}{
		{"plain read", plainRead, func(t *testing.T, err error) {
			if err != nil {
				t.Fatalf("A's late write after a plain read: %v, want it accepted (the gap)", err)
			}
		}, "11"},
		{"claim", claimRead, func(t *testing.T, err error) {
			var se *fence.StaleError
			if !errors.As(err, &se) {
				t.Fatalf("A's late write after B's claim: %v, want a StaleError", err)
			}
		}, "11"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			etcdproc.LeakCheck(t)
			cli := etcd.Client(t)
			name := etcdproc.Name(t, "gap")
			rec, data := name+"-fence", name+"-offset"
			_, a := newLock(t, cli, name)
			write(t, cli, rec, data, a.Token(), "10")

			// A's holding ends (its key goes, as when its lease expires
			// while it is paused); B takes the lock with a larger token.
			if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), a.Key()); err != nil {
				t.Fatal(err)
			}
			<-a.Done()
			_, b := newLock(t, cli, name)
			if b.Token() <= a.Token() {
				t.Fatalf("B's token %d is not above A's %d", b.Token(), a.Token())
			}
			if got := tc.resume(t, cli, rec, data, b.Token()); got != "10" {
				t.Fatalf("B resumed from %q, want 10", got)
			}
			_, lateErr := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, a.Token())).
				Then(clientv3.OpPut(data, "20")).Commit()
			tc.late(t, lateErr)
			write(t, cli, rec, data, b.Token(), "11")
			if v, _ := get(t, cli, data); v != tc.final {
				t.Fatalf("offset %q, want %q", v, tc.final)
			}
		})
	}
}

func write(t *testing.T, cli *clientv3.Client, rec, data string, token int64, v string) {
	t.Helper()
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, token)).Then(clientv3.OpPut(data, v)).Commit(); err != nil {
		t.Fatalf("fenced write of %s with token %d: %v", v, token, err)
	}
}

func plainRead(t *testing.T, cli *clientv3.Client, _, data string, _ int64) string {
	t.Helper()
	v, _ := get(t, cli, data)
	return v
}

// claimRead claims the record and reads in one transaction, in one round
// trip: the record is below the token, as for every new holder.
func claimRead(t *testing.T, cli *clientv3.Client, rec, data string, token int64) string {
	t.Helper()
	kv := &countingKV{KV: cli}
	resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, fence.Claim(rec, token)).Then(clientv3.OpGet(data)).Commit()
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if kv.sent != 1 {
		t.Errorf("a claim over a lower record took %d transactions, want 1", kv.sent)
	}
	if highest, err := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, rec); err != nil || highest != token {
		t.Fatalf("record after the claim: %d %v, want %d", highest, err, token)
	}
	return string(resp.Responses[0].GetResponseRange().Kvs[0].Value)
}

func TestClaim(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	rec := etcdproc.Name(t, "claim") + "/fence"
	data := rec + "-data"
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), data, "v"); err != nil {
		t.Fatal(err)
	}
	read := func(token int64) (*clientv3.TxnResponse, error) {
		return fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Claim(rec, token)).Then(clientv3.OpGet(data)).Commit()
	}
	// A missing record is created by the claim.
	if _, err := read(5); err != nil {
		t.Fatalf("claim of a missing record: %v", err)
	}
	if h, _ := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, rec); h != 5 {
		t.Fatalf("record %d after the first claim, want 5", h)
	}
	// An equal token passes and the record stays.
	if resp, err := read(5); err != nil || len(resp.Responses) != 1 {
		t.Fatalf("claim with the recorded token: %v %v", resp, err)
	}
	// A lower one is refused, its reads do not run, and nothing changes.
	before := revision(t, cli)
	resp, err := read(4)
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Token != 4 || se.Highest != 5 || resp != nil {
		t.Fatalf("lower claim: %v %v, want a StaleError 4 < 5", resp, err)
	}
	if revision(t, cli) != before {
		t.Fatal("a refused claim changed the store")
	}
	if got := fence.Claim(rec, 5).String(); got != "claim("+rec+">=5)" {
		t.Errorf("String() = %q", got)
	}
}

// A lock key (attached to a lease) given as a fence record is refused in
// every shape, and the key keeps its value, its lease and its holder.
func TestLeasedRecordRefused(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "leased")
	_, l := newLock(t, cli, name)
	_, other := newLock(t, cli, name+"-other")
	rec := fence.NewRecorder(l.Key())
	cases := []struct {
		name string
		txn  *fence.Txn
	}{
		{"resource with a write", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(l.Key(), l.Token())).Then(clientv3.OpPut(name+"-data", "x"))},
		{"resource alone", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(l.Key(), l.Token()))},
		{"claim", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Claim(l.Key(), l.Token())).Then(clientv3.OpGet(name + "-data"))},
		{"recorder", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, rec.Guard(l.Token())).Then(clientv3.OpPut(name+"-data", "x"))},
		{"beside held", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(other), fence.Resource(name+"-fence", l.Token()), fence.Resource(l.Key(), l.Token())).Then(clientv3.OpPut(name+"-data", "x"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), l.Key())
			if err != nil {
				t.Fatal(err)
			}
			rev := revision(t, cli)
			_, err = tc.txn.Commit()
			if !errors.Is(err, fence.ErrBadRecord) {
				t.Fatalf("Commit: %v, want ErrBadRecord", err)
			}
			after, err := cli.Get(etcdproc.Ctx(t, 30*time.Second), l.Key())
			if err != nil {
				t.Fatal(err)
			}
			if len(after.Kvs) != 1 || after.Kvs[0].ModRevision != before.Kvs[0].ModRevision || after.Kvs[0].Lease != before.Kvs[0].Lease {
				t.Fatalf("lock key changed: %v -> %v", before.Kvs, after.Kvs)
			}
			if revision(t, cli) != rev {
				t.Fatal("a refused transaction changed the store")
			}
			if l.Err() != nil {
				t.Fatalf("the lock ended: %v", l.Err())
			}
		})
	}
	var _ fence.Holder = (*lease.Lock)(nil)
}

// A refused Claim with several guards (one record above, one leased, one
// below, a Held guard that holds) changes nothing, in whichever shape it
// is decided, and reports the refusal that etcd saw.
func TestRefusedClaimChangesNothing(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	base := etcdproc.Name(t, "refused")
	h, _ := lockPut(t, cli, base+"/lock")
	held := fence.Held(h)
	low, high, leased, missing := base+"/low", base+"/high", base+"/leased", base+"/missing"
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(low, 3)).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(high, 50)).Commit(); err != nil {
		t.Fatal(err)
	}
	leasedPut(t, cli, leased)
	cases := []struct {
		name   string
		guards []fence.Guard
		want   error
	}{
		{"claim above", []fence.Guard{held, fence.Claim(high, 10)}, fence.ErrStale},
		{"claim below, other above", []fence.Guard{held, fence.Claim(low, 10), fence.Resource(high, 10)}, fence.ErrStale},
		{"claim missing, other above", []fence.Guard{fence.Claim(missing, 10), fence.Resource(high, 10)}, fence.ErrStale},
		{"claim missing, other leased", []fence.Guard{fence.Claim(missing, 10), fence.Resource(leased, 10)}, fence.ErrBadRecord},
		{"claim leased", []fence.Guard{held, fence.Claim(leased, 10)}, fence.ErrBadRecord},
		{"claim below, held lost", []fence.Guard{fence.Held(token{h.key, h.tok + 1}), fence.Claim(low, 10)}, fence.ErrNotHeld},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := revision(t, cli)
			resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, tc.guards...).Then(clientv3.OpGet(base + "/data")).Commit()
			if !errors.Is(err, tc.want) || resp != nil {
				t.Fatalf("Commit: %v %v, want %v", resp, err, tc.want)
			}
			if after := revision(t, cli); after != before {
				t.Fatalf("a refused claim moved the store from revision %d to %d", before, after)
			}
			if _, ok := get(t, cli, missing); ok {
				t.Fatal("a refused claim created its missing record")
			}
		})
	}
}

// The compare-only shapes (a check alone, a Recorder's steady write) on a
// record key attached to a lease. The package doc says such a transaction
// is refused with ErrBadRecord and changes nothing.
func TestLeasedRecordRefusedCompareOnly(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(etcdproc.Ctx(t, 30*time.Second), g.ID)
	t.Run("check alone", func(t *testing.T) {
		rec := etcdproc.Name(t, "leased-compare") + "/fence"
		if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), rec, fence.EncodeToken(7), clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 7)).Commit()
		if !errors.Is(err, fence.ErrBadRecord) {
			t.Fatalf("check alone on a leased record: %v, want ErrBadRecord", err)
		}
	})
	t.Run("recorder steady", func(t *testing.T) {
		base := etcdproc.Name(t, "leased-compare")
		rec, data := base+"/fence", base+"/data"
		r := fence.NewRecorder(rec)
		if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(7)).Then(clientv3.OpPut(data, "1")).Commit(); err != nil {
			t.Fatal(err)
		}
		// Someone else's put attaches the record to a lease, same value.
		if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), rec, fence.EncodeToken(7), clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, r.Guard(7)).Then(clientv3.OpPut(data, "2")).Commit()
		if v, _ := get(t, cli, data); !errors.Is(err, fence.ErrBadRecord) || v != "1" {
			t.Fatalf("steady write through a leased record: %v, data %q; want ErrBadRecord and data unchanged", err, v)
		}
	})
}
