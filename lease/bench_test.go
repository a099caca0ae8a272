package lease_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/lease"
)

// locker is what the benchmarks need of a lock implementation: take one
// holding, and give back its key and token and a way to release it.
type locker interface {
	lock(ctx context.Context) (key string, token int64, unlock func(context.Context) error, err error)
}

type ourLocker struct {
	s    *lease.Session
	name string
}

func (o ourLocker) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	l, err := o.s.Lock(ctx, o.name)
	if err != nil {
		return "", 0, nil, err
	}
	return l.Key(), l.Token(), l.Unlock, nil
}

type mutexLocker struct{ m *concurrency.Mutex }

func (m mutexLocker) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	if err := m.m.Lock(ctx); err != nil {
		return "", 0, nil, err
	}
	// IsOwner carries the key's creation revision: the right token, where
	// Mutex's header revision is not when it was contended.
	cmp := m.m.IsOwner()
	return m.m.Key(), cmp.GetCompare().GetCreateRevision(), m.m.Unlock, nil
}

type impl struct {
	name string
	make func(b *testing.B, cli *clientv3.Client, name string) locker
}

var impls = []impl{
	{"leasefence", func(b *testing.B, cli *clientv3.Client, name string) locker {
		s, err := lease.NewSession(context.Background(), cli)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return ourLocker{s, name}
	}},
	{"concurrency.Mutex", func(b *testing.B, cli *clientv3.Client, name string) locker {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return mutexLocker{concurrency.NewMutex(s, name)}
	}},
}

// BenchmarkHandoff measures critical sections per second on one lock name
// with 1, 4 and 16 contenders, each with its own session and client
// connection, for this library and for concurrency.Mutex in the same run.
func BenchmarkHandoff(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		for _, im := range impls {
			b.Run(fmt.Sprintf("contenders=%d/impl=%s", n, im.name), func(b *testing.B) {
				name := etcdtest.Name(b, "handoff")
				lockers := make([]locker, n)
				for i := range lockers {
					lockers[i] = im.make(b, etcd.Client(b), name)
				}
				handoffs(b, lockers)
			})
		}
	}
}

// handoffs runs b.N critical sections spread over lockers, all contending
// for one name, and reports them per second.
func handoffs(b *testing.B, lockers []locker) {
	var left atomic.Int64
	left.Store(int64(b.N))
	ctx := context.Background()
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for _, lk := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				_, _, unlock, err := lk.lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "sections/s")
}

type ourCandidate struct {
	s    *lease.Session
	name string
}

func (o ourCandidate) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	e, err := o.s.Campaign(ctx, o.name, "candidate")
	if err != nil {
		return "", 0, nil, err
	}
	return e.Key(), e.Token(), e.Resign, nil
}

type etcdCandidate struct{ e *concurrency.Election }

func (c etcdCandidate) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	if err := c.e.Campaign(ctx, "candidate"); err != nil {
		return "", 0, nil, err
	}
	return c.e.Key(), c.e.Rev(), c.e.Resign, nil
}

// BenchmarkElectionHandoff is BenchmarkHandoff for leadership: Campaign,
// then Resign, by 1 and 4 candidates, against concurrency.Election in the
// same run.
func BenchmarkElectionHandoff(b *testing.B) {
	candidates := []impl{
		{"leasefence", func(b *testing.B, cli *clientv3.Client, name string) locker {
			s, err := lease.NewSession(context.Background(), cli)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return ourCandidate{s, name}
		}},
		{"concurrency.Election", func(b *testing.B, cli *clientv3.Client, name string) locker {
			s, err := concurrency.NewSession(cli)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return etcdCandidate{concurrency.NewElection(s, name)}
		}},
	}
	for _, n := range []int{1, 4} {
		for _, im := range candidates {
			b.Run(fmt.Sprintf("candidates=%d/impl=%s", n, im.name), func(b *testing.B) {
				name := etcdtest.Name(b, "election")
				lockers := make([]locker, n)
				for i := range lockers {
					lockers[i] = im.make(b, etcd.Client(b), name)
				}
				handoffs(b, lockers)
			})
		}
	}
}

// BenchmarkUncontended is one Lock, one put guarded by the lock's token, and
// Unlock, with nobody else around.
func BenchmarkUncontended(b *testing.B) {
	for _, im := range impls {
		b.Run("impl="+im.name, func(b *testing.B) {
			cli := etcd.Client(b)
			name := etcdtest.Name(b, "uncontended")
			lk := im.make(b, cli, name)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key, token, unlock, err := lk.lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				resp, err := cli.Txn(ctx).
					If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
					Then(clientv3.OpPut(name+"-data", "v")).Commit()
				if err != nil || !resp.Succeeded {
					b.Fatalf("guarded put: %v", err)
				}
				if err := unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkManyLocks holds 10,000 locks on one session and reports the heap
// each held lock costs. One lease serves them all.
func BenchmarkManyLocks(b *testing.B) {
	const n = 10000
	for i := 0; i < b.N; i++ {
		cli := etcd.Client(b)
		s, err := lease.NewSession(context.Background(), cli)
		if err != nil {
			b.Fatal(err)
		}
		prefix := etcdtest.Name(b, "many")
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		locks := make([]*lease.Lock, n)
		for j := range locks {
			if locks[j], err = s.Lock(context.Background(), fmt.Sprintf("%s/%d", prefix, j)); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heapB/lock")
		b.ReportMetric(float64(after.StackInuse-before.StackInuse)/n, "stackB/lock")
		b.ReportMetric(float64(runtime.NumGoroutine())/n, "goroutines/lock")
		leases, err := cli.Leases(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(leases.Leases)), "leases")
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
