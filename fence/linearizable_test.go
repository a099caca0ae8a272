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

// shapeOp is one fenced operation of TestGuardShapesLinearizable and what
// etcd answered.
type shapeOp struct {
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
func TestGuardShapesLinearizable(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			base := etcdproc.Name(t, "linearizable")
			rec, data := base+"/fence", base+"/data"
			start := revision(t, cli)
			const workers, opsEach = 4, 25
			ops := make([][]shapeOp, workers)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
					recorders := map[int64]*fence.Recorder{}
					for i := range opsEach {
						ops[w] = append(ops[w], shapeStep(t, cli, r, recorders, rec, data, fmt.Sprintf("w%d-%d", w, i), int64(i/3)))
					}
				}()
			}
			wg.Wait()
			checkShapeHistory(t, cli, data, start, ops)
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

func shapeStep(t *testing.T, cli *clientv3.Client, r *rand.Rand, recorders map[int64]*fence.Recorder, rec, data, value string, base int64) shapeOp {
	// Tokens rise slowly, as successive holdings do, with overlap.
	tok := 1 + base + r.Int64N(4)
	op := shapeOp{token: tok}
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

func checkShapeHistory(t *testing.T, cli *clientv3.Client, data string, start int64, perWorker [][]shapeOp) {
	t.Helper()
	var all []shapeOp
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
