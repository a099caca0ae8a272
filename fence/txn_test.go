package fence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func TestHeldGuard(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "held")
	data := name + "-data"
	s, l := newLock(t, cli, name)

	resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(l)).Then(clientv3.OpPut(data, "a")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("guarded put while held: %v %v", resp, err)
	}
	if v, _ := get(t, cli, data); v != "a" {
		t.Fatalf("data = %q, want a", v)
	}
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Released: the guard fails before sending (the lock knows) and in etcd
	// (a bare holder with the same key and token).
	for _, h := range []fence.Holder{l, token{l.Key(), l.Token()}} {
		_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(h)).Then(clientv3.OpPut(data, "late")).Commit()
		var nh *fence.NotHeldError
		if !errors.Is(err, fence.ErrNotHeld) || !errors.As(err, &nh) || nh.Key != l.Key() || nh.Token != l.Token() {
			t.Fatalf("guarded put after unlock (%T): %v, want a NotHeldError for %s@%d", h, err, l.Key(), l.Token())
		}
		if !strings.Contains(err.Error(), l.Key()) {
			t.Errorf("error %q does not name the key", err)
		}
		if h == fence.Holder(l) && (!errors.Is(err, lease.ErrUnlocked) || !strings.Contains(err.Error(), "has ended")) {
			t.Errorf("a holder known to have ended: %q, want it to say so, with the holder's reason", err)
		}
	}
	// A fresh lock on the same name and session has the same key but a new
	// token: the old guard never passes.
	l2, err := s.Lock(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Key() != l.Key() || l2.Token() <= l.Token() {
		t.Fatalf("relock: key %s token %d, before %s %d", l2.Key(), l2.Token(), l.Key(), l.Token())
	}
	_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(token{l.Key(), l.Token()})).Then(clientv3.OpPut(data, "late")).Commit()
	var nh *fence.NotHeldError
	if !errors.As(err, &nh) || nh.Current != l2.Token() {
		t.Fatalf("old token against new lock: %v, want NotHeldError with current %d", err, l2.Token())
	}
	if v, _ := get(t, cli, data); v != "a" {
		t.Fatalf("a failed guard wrote: data = %q", v)
	}
}

// A failed caller If is no error and runs Else; a failed guard runs neither.
func TestGuardAndCallerIf(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "if")
	data, other := name+"-data", name+"-other"
	_, l := newLock(t, cli, name)

	resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(l)).
		If(clientv3.Compare(clientv3.Value(data), "=", "nope")).
		Then(clientv3.OpPut(data, "then")).
		Else(clientv3.OpPut(other, "else"), clientv3.OpGet(data)).
		Commit()
	if err != nil {
		t.Fatalf("caller If failing is not an error: %v", err)
	}
	if resp.Succeeded || len(resp.Responses) != 2 || resp.Responses[1].GetResponseRange() == nil {
		t.Fatalf("response = %+v, want the Else branch's two responses", resp)
	}
	if v, ok := get(t, cli, other); !ok || v != "else" {
		t.Fatalf("Else did not run: %q", v)
	}
	if _, ok := get(t, cli, data); ok {
		t.Fatal("Then ran too")
	}

	stale := token{l.Key(), l.Token() - 1}
	before := revision(t, cli)
	_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(stale)).
		If(clientv3.Compare(clientv3.Value(data), "=", "nope")).
		Then(clientv3.OpPut(data, "then")).
		Else(clientv3.OpPut(other, "else2")).
		Commit()
	if !errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("failed guard: %v, want ErrNotHeld", err)
	}
	if after := revision(t, cli); after != before {
		t.Fatalf("a failed guard changed the store (revision %d -> %d)", before, after)
	}
}

func TestResourceGuard(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	base := etcdproc.Name(t, "res")
	rec, data := base+"/fence", base+"/data"
	put := func(tok int64, v string) error {
		_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, tok)).Then(clientv3.OpPut(data, v)).Commit()
		return err
	}
	// First write: no record yet.
	if err := put(9, "nine"); err != nil {
		t.Fatalf("first write: %v", err)
	}
	if v, _ := get(t, cli, rec); v != fence.EncodeToken(9) {
		t.Fatalf("record = %q, want token 9 encoded", v)
	}
	// Equal token again: accepted. 10 after 9: accepted (plain decimal
	// would order "10" before "9").
	for _, tok := range []int64{9, 10} {
		if err := put(tok, "v"+string(rune('0'+tok%10))); err != nil {
			t.Fatalf("token %d after 9: %v", tok, err)
		}
	}
	before := revision(t, cli)
	err := put(9, "stale")
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Highest != 10 || se.Token != 9 || se.Key != rec {
		t.Fatalf("token 9 after 10: %v, want StaleError{%s 9 10}", err, rec)
	}
	if after := revision(t, cli); after != before {
		t.Fatal("a stale write changed the store")
	}
	if v, _ := get(t, cli, data); v != "v0" {
		t.Fatalf("data = %q after the stale write, want v0", v)
	}
}

// Several guards of both kinds commit in one transaction, and any one
// failing stops all.
func TestSeveralGuards(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "several")
	_, l := newLock(t, cli, name)
	r1, r2, data := name+"-r1", name+"-r2", name+"-data"
	guards := func(t1, t2 int64) []fence.Guard {
		return []fence.Guard{fence.Held(l), fence.Resource(r1, t1), fence.Resource(r2, t2)}
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, guards(l.Token(), l.Token())...).Then(clientv3.OpPut(data, "1")).Commit(); err != nil {
		t.Fatal(err)
	}
	// r2 moves on through another writer; a write with both guards fails on
	// r2 alone and changes neither record.
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(r2, l.Token()+5)).Commit(); err != nil {
		t.Fatal(err)
	}
	_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, guards(l.Token()+1, l.Token()+1)...).Then(clientv3.OpPut(data, "2")).Commit()
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Key != r2 || errors.Is(err, fence.ErrNotHeld) {
		t.Fatalf("err = %v, want only r2 stale", err)
	}
	if v, _ := get(t, cli, r1); v != fence.EncodeToken(l.Token()) {
		t.Fatal("r1 moved though the transaction failed")
	}
	if v, _ := get(t, cli, data); v != "1" {
		t.Fatalf("data = %q", v)
	}
}

func TestBadInput(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	rec := etcdproc.Name(t, "bad") + "/fence"
	many := make([]clientv3.Op, fence.MaxTxnOps+1)
	for i := range many {
		many[i] = clientv3.OpPut(rec+"-x"+string(rune('a'+i%26))+string(rune('a'+i/26)), "v")
	}
	cases := []struct {
		name string
		txn  *fence.Txn
	}{
		{"token zero", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 0))},
		{"token negative", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(token{"k", -3}))},
		{"empty record key", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource("", 5))},
		{"empty lock key", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(token{"", 5}))},
		{"nil holder", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Held(nil))},
		{"zero guard", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Guard{})},
		{"nil kv", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), nil, fence.Resource(rec, 5))},
		{"two guards on one record", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5), fence.Resource(rec, 6))},
		{"put on the record", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Then(clientv3.OpPut(rec, "x"))},
		{"delete of the record", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Else(clientv3.OpDelete(rec))},
		{"prefix delete covering the record", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Then(clientv3.OpDelete(rec[:5], clientv3.WithPrefix()))},
		{"nested put on the record", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Then(clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(rec, "x")}, nil))},
		{"too many operations", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Then(many...)},
		{"no guard", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli).Then(clientv3.OpPut(rec+"-data", "unfenced"))},
		{"claim with token zero", fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Claim(rec, 0)).Then(clientv3.OpGet(rec))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := revision(t, cli)
			_, err := tc.txn.Commit()
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("Commit: %v, want ErrInvalidArgument", err)
			}
			if after := revision(t, cli); after != before {
				t.Fatal("bad input changed the store")
			}
		})
	}
}

// An answer that never comes is an unknown outcome, not a failure: here the
// write did land.
func TestOutcomeUnknown(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	p, viaProxy, _ := etcdproc.ProxiedClient(t, etcd.Endpoints()[0])
	base := etcdproc.Name(t, "unknown")
	rec, data := base+"/fence", base+"/data"
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), viaProxy, fence.Resource(rec, 3)).Then(clientv3.OpPut(data, "a")).Commit(); err != nil {
		t.Fatal(err)
	}
	p.PauseRx() // etcd's answers are held back; requests still get through
	defer p.UnpauseRx()
	wch := cli.Watch(etcdproc.Ctx(t, 30*time.Second), data, clientv3.WithCreatedNotify())
	<-wch
	ctx, cancel := testCtxWithTimeout(t, 500*time.Millisecond)
	defer cancel()
	_, err := fence.NewTxn(ctx, viaProxy, fence.Resource(rec, 4)).Then(clientv3.OpPut(data, "b")).Commit()
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Commit without an answer: %v, want ErrOutcomeUnknown", err)
	}
	select {
	case wr := <-wch:
		if len(wr.Events) == 0 || string(wr.Events[0].Kv.Value) != "b" {
			t.Fatalf("unexpected watch response %+v", wr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the write did not land; this test needs one that did")
	}
}

// A new record and an existing one in the same transaction: one round trip
// (the store revision moves by exactly one), and a refusal by the second
// record leaves the first untouched.
func TestFirstWriteInOneTransaction(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	base := etcdproc.Name(t, "first")
	old, fresh, data := base+"/old", base+"/fresh", base+"/data"
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(old, 5)).Commit(); err != nil {
		t.Fatal(err)
	}
	before := revision(t, cli)
	_, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(fresh, 4), fence.Resource(old, 4)).Then(clientv3.OpPut(data, "x")).Commit()
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("err = %v, want stale on %s", err, old)
	}
	if _, ok := get(t, cli, fresh); ok || revision(t, cli) != before {
		t.Fatal("a refused transaction created the fresh record")
	}
	resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(fresh, 6), fence.Resource(old, 6)).Then(clientv3.OpPut(data, "y")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Revision != before+1 {
		t.Errorf("revision %d after %d: want one transaction", resp.Header.Revision, before)
	}
	if v, _ := get(t, cli, fresh); v != fence.EncodeToken(6) {
		t.Errorf("fresh record = %q", v)
	}
}

// A claim whose reads are too large for the client's receive limit: etcd
// applied it (the record is raised), but the answer never arrived. That
// outcome is unknown, and must not be reported as a definite failure.
func TestClaimAnswerTooLargeOutcomeUnknown(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	small, err := clientv3.New(clientv3.Config{
		Endpoints:          etcd.Endpoints(),
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	base := etcdproc.Name(t, "big-answer")
	rec, data := base+"/fence", base+"/data"
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), data, strings.Repeat("x", 200<<10)); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 5)).Commit(); err != nil {
		t.Fatal(err)
	}
	_, err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), small, fence.Claim(rec, 10)).Then(clientv3.OpGet(data)).Commit()
	highest, rerr := fence.ReadRecord(etcdproc.Ctx(t, 30*time.Second), cli, rec)
	if rerr != nil {
		t.Fatal(rerr)
	}
	t.Logf("claim: %v; record now %d", err, highest)
	if err == nil {
		t.Fatal("the claim's answer arrived through a 64 KiB receive limit")
	}
	if highest == 10 && !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("etcd applied the claim (record 10), yet Commit reported a definite failure: %v", err)
	}
}
