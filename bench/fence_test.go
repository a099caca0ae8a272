package bench

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// BenchmarkGuardedPut compares one put by a holder that keeps its lock,
// guarded by Held (the lock key's creation revision), plain, and guarded by
// a fence record in the steady state (the record already holds the token,
// as it does for every write of a holder after its first) through Resource
// and through a Recorder. The four take turns (interleave) on one client,
// each writing a key of its own; ratios are to Held.
func BenchmarkGuardedPut(b *testing.B) {
	for _, fs := range fsyncModes {
		b.Run("fsync="+fs.name, func(b *testing.B) {
			cli := newClient(b, cluster(b, 1, fs.off).Endpoints()[0], &requests{})
			ctx := context.Background()
			name := etcdproc.Name(b, "put")
			l := heldLock(b, cli, name)
			rec := fence.NewRecorder(name + "-recorder")
			guarded := func(data string, guard fence.Guard) func() error {
				return func() error {
					_, err := fence.NewTxn(ctx, cli, guard).Then(clientv3.OpPut(data, "v")).Commit()
					return err
				}
			}
			turns := []turn{
				{"held", guarded(name+"-held", fence.Held(l))},
				{"plain", func() error {
					_, err := cli.Put(ctx, name+"-plain", "v")
					return err
				}},
				{"resource", guarded(name+"-resource", fence.Resource(name+"-record", l.Token()))},
				{"recorder", guarded(name+"-recorded", rec.Guard(l.Token()))},
			}
			// The first writes record the token; the turns measure the
			// steady state after them.
			for _, t := range turns {
				if err := t.op(); err != nil {
					b.Fatal(err)
				}
			}
			interleave(b, turns)
		})
	}
}

// heldLock takes the lock name on a new session of cli, both released when
// b ends.
func heldLock(b *testing.B, cli *clientv3.Client, name string) *lease.Lock {
	b.Helper()
	ctx := context.Background()
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	l, err := s.Lock(ctx, name)
	if err != nil {
		b.Fatal(err)
	}
	return l
}
