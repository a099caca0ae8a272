package bench

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// BenchmarkGuardedPut compares one put, plain and guarded, by a holder
// that keeps its lock: Held (the lock key's creation revision), and a fence
// record in the steady state (the record already holds the token, as it
// does for every write of a holder after its first), through Resource and
// through a Recorder.
func BenchmarkGuardedPut(b *testing.B) {
	for _, fs := range fsyncModes {
		c := func(b *testing.B) *clientv3.Client {
			return newClient(b, cluster(b, 1, fs.off).Endpoints()[0], &requests{})
		}
		cases := []struct {
			impl   string
			commit func(ctx context.Context, cli *clientv3.Client, l *lease.Lock, data, rec string) error
		}{
			{"plain", func(ctx context.Context, cli *clientv3.Client, _ *lease.Lock, data, _ string) error {
				_, err := cli.Put(ctx, data, "v")
				return err
			}},
			{"held", func(ctx context.Context, cli *clientv3.Client, l *lease.Lock, data, _ string) error {
				_, err := fence.NewTxn(ctx, cli, fence.Held(l)).Then(clientv3.OpPut(data, "v")).Commit()
				return err
			}},
			{"resource", func(ctx context.Context, cli *clientv3.Client, l *lease.Lock, data, rec string) error {
				_, err := fence.NewTxn(ctx, cli, fence.Resource(rec, l.Token())).Then(clientv3.OpPut(data, "v")).Commit()
				return err
			}},
			{"recorder", nil}, // built per run: a Recorder lives as long as its writer
		}
		for _, tc := range cases {
			b.Run("fsync="+fs.name+"/impl="+tc.impl, func(b *testing.B) {
				cli := c(b)
				ctx := context.Background()
				s, err := lease.NewSession(ctx, cli)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				name := etcdtest.Name(b, "put")
				l, err := s.Lock(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				data, rec := name+"-data", name+"-fence"
				commit := tc.commit
				if commit == nil {
					r := fence.NewRecorder(rec)
					commit = func(ctx context.Context, cli *clientv3.Client, l *lease.Lock, data, _ string) error {
						_, err := fence.NewTxn(ctx, cli, r.Guard(l.Token())).Then(clientv3.OpPut(data, "v")).Commit()
						return err
					}
				}
				// The first write records the token; the loop measures the
				// steady state after it.
				if err := commit(ctx, cli, l, data, rec); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := commit(ctx, cli, l, data, rec); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
