package fence_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// reviewOp is one fenced operation of TestReviewClaimLinearizable and what
// etcd answered.
type reviewOp struct {
	kind  string
	token int64
	value string // the data value a write puts; "" for a claim or check
	rev   int64  // header revision of a success
	write bool   // the success made a revision of its own
	err   error
}

// Concurrent holders with random tokens, through every shape (Resource
// writes, Recorder writes, Claims with reads, checks alone, and a record
// that is deleted now and then so that the full shape runs): ordered by
// etcd's revision, the tokens of the successes never go down, every value
// the data key ever held was put by a success, every refusal is a
// StaleError naming a higher token, and a claim's read is the data as of
// its revision.
func TestReviewClaimLinearizable(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			base := etcdproc.Name(t, "review-lin")
			rec, data := base+"/fence", base+"/data"
			start := revision(t, cli)
			const workers, opsEach = 4, 25
			ops := make([][]reviewOp, workers)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
					recorders := map[int64]*fence.Recorder{}
					for i := range opsEach {
						ops[w] = append(ops[w], reviewStep(t, cli, r, recorders, rec, data, fmt.Sprintf("w%d-%d", w, i), int64(i/3)))
					}
				}()
			}
			wg.Wait()
			checkReviewHistory(t, cli, data, start, ops)
			n := map[string]int{}
			for _, w := range ops {
				for _, op := range w {
					if op.err == nil {
						n[op.kind]++
					} else {
						n[op.kind+" refused"]++
					}
				}
			}
			t.Logf("outcomes: %v", n)
		})
	}
}

func reviewStep(t *testing.T, cli *clientv3.Client, r *rand.Rand, recorders map[int64]*fence.Recorder, rec, data, value string, base int64) reviewOp {
	// Tokens rise slowly, as successive holdings do, with overlap.
	tok := 1 + base + r.Int64N(4)
	op := reviewOp{token: tok}
	var resp *clientv3.TxnResponse
	switch r.IntN(6) {
	case 0, 1:
		op.kind, op.value = "resource", value
		resp, op.err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, tok)).Then(clientv3.OpPut(data, value)).Commit()
	case 2:
		op.kind, op.value = "recorder", value
		rc := recorders[tok]
		if rc == nil {
			rc = fence.NewRecorder(rec)
			recorders[tok] = rc
		}
		resp, op.err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, rc.Guard(tok)).Then(clientv3.OpPut(data, value)).Commit()
	case 3, 4:
		op.kind = "claim"
		resp, op.err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Claim(rec, tok)).Then(clientv3.OpGet(data)).Commit()
		if op.err == nil {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) > 0 {
				op.value = string(kvs[0].Value)
			}
		}
	case 5:
		if r.IntN(4) == 0 {
			// A record deleted behind the holders' backs: the next
			// writes take the full shape. Tokens start over then, so
			// the history is cut here.
			op.kind = "delete"
			d, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), rec)
			op.err, op.rev = err, d.Header.Revision
			return op
		}
		op.kind = "check"
		resp, op.err = fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, tok)).Commit()
	}
	if op.err == nil {
		op.rev = resp.Header.Revision
		op.write = op.kind != "check"
	}
	return op
}

func checkReviewHistory(t *testing.T, cli *clientv3.Client, data string, start int64, perWorker [][]reviewOp) {
	t.Helper()
	var all []reviewOp
	for _, w := range perWorker {
		all = append(all, w...)
	}
	put := map[string]bool{}
	for _, op := range all {
		var se *fence.StaleError
		switch {
		case op.err == nil:
			if op.kind == "resource" || op.kind == "recorder" {
				put[op.value] = true
			}
		case errors.As(op.err, &se):
			if se.Highest <= se.Token || se.Token != op.token {
				t.Errorf("%s with token %d: StaleError %v names no higher token", op.kind, op.token, se)
			}
		default:
			t.Errorf("%s with token %d: unexpected error %v", op.kind, op.token, op.err)
		}
	}
	// Successes in revision order; a read at revision r follows the write
	// that made r.
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].rev != all[j].rev {
			return all[i].rev < all[j].rev
		}
		return all[i].write && !all[j].write
	})
	var highest int64
	for _, op := range all {
		switch {
		case op.err != nil:
		case op.kind == "delete":
			highest = 0
		case op.token < highest:
			t.Errorf("%s with token %d succeeded at revision %d after token %d had been accepted", op.kind, op.token, op.rev, highest)
		default:
			highest = op.token
		}
	}
	// Every value the data key held was put by a success, and each
	// claim read the value of its revision.
	at := map[int64]string{}
	final := revision(t, cli)
	if len(put) == 0 {
		t.Fatal("no write succeeded")
	}
	wch := cli.Watch(etcdproc.Ctx(t, 30*time.Second), data, clientv3.WithRev(start+1))
	var revs []int64
	for len(revs) == 0 || revs[len(revs)-1] < final {
		wr, ok := <-wch
		if !ok || wr.Err() != nil {
			t.Fatalf("watch: %v", wr.Err())
		}
		if len(wr.Events) == 0 {
			break
		}
		for _, ev := range wr.Events {
			v := string(ev.Kv.Value)
			if !put[v] {
				t.Errorf("data held %q at revision %d, put by no successful write", v, ev.Kv.ModRevision)
			}
			at[ev.Kv.ModRevision] = v
			revs = append(revs, ev.Kv.ModRevision)
		}
		if len(revs) == len(put) {
			break
		}
	}
	if len(revs) != len(put) {
		t.Errorf("%d writes succeeded, the data key changed %d times", len(put), len(revs))
	}
	for _, op := range all {
		if op.err != nil || op.kind != "claim" {
			continue
		}
		want := ""
		for _, r := range revs {
			if r <= op.rev {
				want = at[r]
			}
		}
		if op.value != want {
			t.Errorf("claim with token %d at revision %d read %q, the data was %q", op.token, op.rev, op.value, want)
		}
	}
}

// A refused Claim with several guards (one record above, one leased, one
// below, a Held guard that holds) changes nothing, in whichever shape it
// is decided, and reports the refusal that etcd saw.
func TestReviewRefusedClaimChangesNothing(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	base := etcdproc.Name(t, "review-refused")
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

// Held on a lock key that someone else's put moved off its lease, onto
// another live lease and then onto none: the key keeps its creation
// revision both times, and Held refuses it with Detached set, in the
// Held-only shape and beside a Claim (one-level shape), changing nothing.
func TestReviewHeldForeignLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	h, _ := lockPut(t, cli, etcdproc.Name(t, "review-held")+"/lock")
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
