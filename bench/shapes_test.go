package bench

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// BenchmarkTxnShapes measures, in turns, the transaction shapes a fence
// record check can take in its steady state (the record already holds the
// writer's token), each with one put of the caller's, against the Held
// guard's shape. It is what chose fence's one-level shapes: on etcd 3.7
// any nesting costs the server about 15 us (it marshals a nested request
// into its raft entry through protobuf's reflection), more than writing
// the record again. The server is an embedded 3.7 member with fsync off,
// or the first of ETCD_ENDPOINTS (to measure another version).
func BenchmarkTxnShapes(b *testing.B) {
	var endpoint string
	if eps, ok := etcdproc.External(); ok {
		endpoint = eps[0]
	} else {
		endpoint = cluster(b, 1, true).Endpoints()[0]
	}
	cli := newClient(b, endpoint, &requests{})
	ctx := context.Background()
	name := etcdproc.Name(b, "shapes")
	l := heldLock(b, cli, name)
	rec, enc := name+"-record", fence.EncodeToken(l.Token())
	if _, err := cli.Put(ctx, rec, enc); err != nil {
		b.Fatal(err)
	}
	atToken := clientv3.Compare(clientv3.Value(rec), "=", enc)
	atMost := clientv3.Compare(clientv3.Value(rec), "<", enc+"\x00")
	above := clientv3.Compare(clientv3.Value(rec), ">", enc)
	raise := clientv3.OpTxn([]clientv3.Cmp{atToken}, nil, []clientv3.Op{clientv3.OpPut(rec, enc)})
	readRecord := clientv3.OpGet(rec)
	shape := func(data string, build func(put clientv3.Op) clientv3.Txn) turn {
		return turn{data, func() error {
			_, err := build(clientv3.OpPut(name+"-"+data, "v")).Commit()
			return err
		}}
	}
	turns := []turn{
		shape("held", func(put clientv3.Op) clientv3.Txn {
			return cli.Txn(ctx).If(fence.HeldCmps(l)...).Then(put).Else(clientv3.OpGet(l.Key(), clientv3.WithKeysOnly()))
		}),
		// A Recorder's steady shape: compare only.
		shape("equal", func(put clientv3.Op) clientv3.Txn {
			return cli.Txn(ctx).If(atToken).Then(put).Else(readRecord)
		}),
		// fence's raising one-level shape: compare, write the record again.
		shape("rewrite", func(put clientv3.Op) clientv3.Txn {
			return cli.Txn(ctx).If(atMost).Then(clientv3.OpPut(rec, enc), put).Else(readRecord)
		}),
		// fence's full shape, as sent until 2026-12-03: an empty outer
		// level, the record's check, the raise nested in it.
		shape("nested", func(put clientv3.Op) clientv3.Txn {
			return cli.Txn(ctx).Then(clientv3.OpTxn([]clientv3.Cmp{above}, []clientv3.Op{readRecord}, []clientv3.Op{raise, put}))
		}),
		// The same without the empty outer level.
		shape("nested-1", func(put clientv3.Op) clientv3.Txn {
			return cli.Txn(ctx).If(above).Then(readRecord).Else(raise, put)
		}),
		// The steady compare, with the full check in an Else it does not
		// run: the nesting costs even unrun.
		shape("equal+else", func(put clientv3.Op) clientv3.Txn {
			return cli.Txn(ctx).If(atToken).Then(put).Else(clientv3.OpTxn([]clientv3.Cmp{above}, []clientv3.Op{readRecord}, []clientv3.Op{clientv3.OpPut(rec, enc), put}))
		}),
	}
	interleave(b, turns)
}
