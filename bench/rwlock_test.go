package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/lease"
)

// readLocker takes read holdings (RLock); every nth acquisition, if n > 0,
// is a write (Lock) instead.
type readLocker struct {
	s     *lease.Session
	name  string
	n     int64
	count *atomic.Int64
}

func (r readLocker) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	take := r.s.RLock
	if r.n > 0 && r.count.Add(1)%r.n == 0 {
		take = r.s.Lock
	}
	l, err := take(ctx, r.name)
	if err != nil {
		return "", 0, nil, err
	}
	return l.Key(), l.Token(), l.Unlock, nil
}

// readImpl is a contender taking read holdings, with every nth one a
// write (none if n is 0).
func readImpl(label string, n int64) impl {
	return impl{label, func(b *testing.B, cli *clientv3.Client, name string, opts ...lease.Option) locker {
		s, err := lease.NewSession(context.Background(), cli, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return readLocker{s: s, name: name, n: n, count: new(atomic.Int64)}
	}}
}

// BenchmarkReadLock sets read holdings beside exclusive ones, in one run:
// each contender takes a holding of one name and releases it at once,
// as in BenchmarkHandoff; readers overlap instead of handing off. The
// "1w7r" contenders take every eighth holding as a writer.
func BenchmarkReadLock(b *testing.B) {
	rw := []impl{impls[0], readImpl("leasefence-read", 0), readImpl("leasefence-1w7r", 8), impls[1]}
	for _, fs := range fsyncModes {
		for _, n := range []int{1, 4, 16} {
			for _, im := range rw {
				b.Run(fmt.Sprintf("fsync=%s/shape=shared/contenders=%d/impl=%s", fs.name, n, im.name), func(b *testing.B) {
					c := cluster(b, 1, fs.off)
					handoffBench(b, im, "shared", n, c.Endpoints()[0])
				})
			}
		}
	}
}
