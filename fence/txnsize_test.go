package fence_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// countingKV counts the transactions that reach etcd, those of them that
// nest a transaction, and those that may write (a put or delete in either
// branch, at any depth: etcd serves any other as a read).
type countingKV struct {
	clientv3.KV
	sent, nested, writing int
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	k.sent++
	return &shapeTxn{Txn: k.KV.Txn(ctx), kv: k}
}

// shapeTxn tells its countingKV whether it nests a transaction and
// whether it may write.
type shapeTxn struct {
	clientv3.Txn
	kv           *countingKV
	nests, write bool
}

func (t *shapeTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *shapeTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.note(ops)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *shapeTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.note(ops)
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *shapeTxn) note(ops []clientv3.Op) {
	t.nests = t.nests || slices.ContainsFunc(ops, clientv3.Op.IsTxn)
	t.write = t.write || mayWrite(ops)
}

// mayWrite tells whether ops hold a put or a delete, at any depth.
func mayWrite(ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsPut() || op.IsDelete() {
			return true
		}
		if _, then, els := op.Txn(); op.IsTxn() && (mayWrite(then) || mayWrite(els)) {
			return true
		}
	}
	return false
}

func (t *shapeTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.nests {
		t.kv.nested++
	}
	if t.write {
		t.kv.writing++
	}
	return t.Txn.Commit()
}

// TestTxnSizeBoundary commits, for every number of Held and Resource
// guards, the largest Then that the documented allowance gives (etcd must
// accept it), and one operation more (refused before anything is sent).
func TestTxnSizeBoundary(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	base := etcdproc.Name(t, "size")
	for held := 0; held <= 2; held++ {
		for res := 0; res <= fence.MaxResourceGuards; res++ {
			if held+res == 0 {
				continue
			}
			t.Run(fmt.Sprintf("held=%d/resource=%d", held, res), func(t *testing.T) {
				prefix := fmt.Sprintf("%s/h%d-r%d", base, held, res)
				var guards []fence.Guard
				for i := 0; i < held; i++ {
					h, _ := lockPut(t, cli, fmt.Sprintf("%s/lock%d", prefix, i))
					guards = append(guards, fence.Held(h))
				}
				for i := 0; i < res; i++ {
					guards = append(guards, fence.Resource(fmt.Sprintf("%s/rec%d", prefix, i), 7))
				}
				limit := fence.MaxTxnOps
				if res > 0 {
					limit = fence.MaxTxnOps - (2*held + res) - 2*res
				}
				puts := func(n int) []clientv3.Op {
					ops := make([]clientv3.Op, n)
					for i := range ops {
						ops[i] = clientv3.OpPut(fmt.Sprintf("%s/data%03d", prefix, i), "v")
					}
					return ops
				}
				kv := &countingKV{KV: cli}
				if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, guards...).Then(puts(limit + 1)...).Commit(); !errors.Is(err, fence.ErrInvalidArgument) {
					t.Fatalf("%d operations: %v, want ErrInvalidArgument", limit+1, err)
				}
				if kv.sent != 0 {
					t.Fatalf("an oversized transaction was sent")
				}
				resp, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), kv, guards...).Then(puts(limit)...).Commit()
				if err != nil || !resp.Succeeded || len(resp.Responses) != limit {
					t.Fatalf("%d operations: %v, %v", limit, resp, err)
				}
			})
		}
	}
}

// TestTxnSizeNested: the caller's own nested transactions count against
// what the guards leave, at every depth.
func TestTxnSizeNested(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	rec := etcdproc.Name(t, "size-nested") + "/fence"
	ops := func(n int) []clientv3.Op {
		out := make([]clientv3.Op, n)
		for i := range out {
			out[i] = clientv3.OpPut(fmt.Sprintf("%s-%03d", rec, i), "v")
		}
		return out
	}
	// One Resource guard: the outer level takes 1, and the record's level
	// 2 (its Else holds the record's put and the caller's txn), so the
	// caller's If/Then/Else get 128 - 3 = 125, as does a nested txn of its
	// own in Then.
	const room = fence.MaxTxnOps - 3
	cmp := clientv3.Compare(clientv3.CreateRevision(rec+"-000"), ">", -1)
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 1)).If(cmp).Then(ops(room)...).Commit(); err != nil {
		t.Fatalf("%d operations under If: %v", room, err)
	}
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 1)).If(cmp).Then(ops(room + 1)...).Commit(); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("%d operations under If: %v, want ErrInvalidArgument", room+1, err)
	}
	inner := clientv3.OpTxn(nil, ops(room), nil)
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 1)).Then(inner).Commit(); err != nil {
		t.Fatalf("caller's nested txn of %d: %v", room, err)
	}
	inner = clientv3.OpTxn(nil, ops(room+1), nil)
	if _, err := fence.NewTxn(etcdproc.Ctx(t, 30*time.Second), cli, fence.Resource(rec, 1)).Then(inner).Commit(); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("caller's nested txn of %d: %v, want ErrInvalidArgument", room+1, err)
	}
}
