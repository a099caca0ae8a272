package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// locker is one contender: it takes a holding and gives back its key and
// token and a way to release it.
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

// impl makes a contender on a client: a session of its own and a lock of
// the given name. opts are extra session options for this library.
type impl struct {
	name string
	make func(b *testing.B, cli *clientv3.Client, name string, opts ...lease.Option) locker
}

var impls = []impl{
	{"leasefence", func(b *testing.B, cli *clientv3.Client, name string, opts ...lease.Option) locker {
		s, err := lease.NewSession(context.Background(), cli, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return ourLocker{s, name}
	}},
	{"concurrency.Mutex", func(b *testing.B, cli *clientv3.Client, name string, _ ...lease.Option) locker {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return mutexLocker{concurrency.NewMutex(s, name)}
	}},
}

// shapes are the ways contenders reach etcd: one client for the whole
// process, as a service has; the same with this library's sessions renewed
// through one lease.Keeper, which also shares each lock name's queue watch
// among them; or a client connection each.
var shapes = []string{"shared", "keeper", "each"}

// contenders builds n contenders of im in the given shape, their requests
// counted into r.
func contenders(b *testing.B, im impl, shape string, n int, endpoint, name string, r *requests) []locker {
	b.Helper()
	var shared *clientv3.Client
	var opts []lease.Option
	if shape != "each" {
		shared = newClient(b, endpoint, r)
	}
	if shape == "keeper" {
		k, err := lease.NewKeeper(shared)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { k.Close() }) // after the sessions' own cleanups
		opts = append(opts, lease.WithKeeper(k))
	}
	lockers := make([]locker, n)
	for i := range lockers {
		cli := shared
		if cli == nil {
			cli = newClient(b, endpoint, r)
		}
		lockers[i] = im.make(b, cli, name, opts...)
	}
	return lockers
}

// BenchmarkCommitBound is the commit bound itself: sequential plain puts,
// reported as 1 / the median latency.
func BenchmarkCommitBound(b *testing.B) {
	for _, fs := range fsyncModes {
		b.Run("fsync="+fs.name, func(b *testing.B) {
			c := cluster(b, 1, fs.off)
			cli := newClient(b, c.Endpoints()[0], &requests{})
			key := etcdproc.Name(b, "bound")
			b.ResetTimer()
			var bound float64
			for i := 0; i < b.N; i++ {
				bound = commitBound(b, cli, key)
			}
			b.ReportMetric(bound, "puts/s")
		})
	}
}

// BenchmarkHandoff measures critical sections per second on one lock name:
// each contender in turn takes the lock and releases it at once, so the
// figure is the lock's own throughput. It reports the share of the commit
// bound measured just before, the requests per handoff and the acquire
// latency.
func BenchmarkHandoff(b *testing.B) {
	for _, fs := range fsyncModes {
		for _, shape := range shapes {
			for _, n := range []int{1, 4, 16, 256} {
				if n == 256 && shape == "each" {
					continue // 256 connections measure the machine, not the lock
				}
				for _, im := range impls {
					if shape == "keeper" && im.name != "leasefence" {
						continue // etcd's sessions on one client share its lessor anyway
					}
					b.Run(fmt.Sprintf("fsync=%s/shape=%s/contenders=%d/impl=%s", fs.name, shape, n, im.name), func(b *testing.B) {
						c := cluster(b, 1, fs.off)
						handoffBench(b, im, shape, n, c.Endpoints()[0])
					})
				}
			}
		}
	}
}

func handoffBench(b *testing.B, im impl, shape string, n int, endpoint string) {
	var r requests
	name := etcdproc.Name(b, "handoff")
	lockers := contenders(b, im, shape, n, endpoint, name, &r)
	measureHandoffs(b, lockers, &r, endpoint, name)
}

// measureHandoffs measures the commit bound on a client of its own, then
// runs b.N handoffs among lockers and reports them per second, as a share
// of the bound, with the CPU, the requests (counted into r) and the
// acquire latency per handoff.
func measureHandoffs(b *testing.B, lockers []locker, r *requests, endpoint, name string) {
	bound := commitBound(b, newClient(b, endpoint, &requests{}), name+"-bound")
	before, cpu := r.read(), cpuTime()
	var lat latencies
	b.ResetTimer()
	rate := handoffs(b, lockers, b.N, &lat)
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
	r.report(b, before, b.N)
	lat.report(b)
	b.ReportMetric(rate, "sections/s")
	b.ReportMetric(100*rate/bound, "%bound")
}

// handoffs runs n critical sections spread over lockers, all contending
// for one name, and returns them per second.
func handoffs(b *testing.B, lockers []locker, n int, lat *latencies) float64 {
	var left atomic.Int64
	left.Store(int64(n))
	ctx := context.Background()
	var wg sync.WaitGroup
	start := time.Now()
	for _, lk := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				t := time.Now()
				_, _, unlock, err := lk.lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				lat.add(time.Since(t))
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkAfterContention is BenchmarkHandoff's one contender on a name
// that was contended just before: four contenders first hand the lock
// round a hundred times, then one of them alone takes and releases it,
// measured. A service whose lock is contended now and then spends most
// of its time so; the watches contention opened may cost it on every
// lock after (this library rests them, see lease's restAfter), where
// concurrency.Mutex opens a watch only while it waits.
func BenchmarkAfterContention(b *testing.B) {
	for _, fs := range fsyncModes {
		for _, shape := range shapes {
			for _, im := range impls {
				if shape == "keeper" && im.name != "leasefence" {
					continue
				}
				b.Run(fmt.Sprintf("fsync=%s/shape=%s/impl=%s", fs.name, shape, im.name), func(b *testing.B) {
					c := cluster(b, 1, fs.off)
					var r requests
					name := etcdproc.Name(b, "after")
					lockers := contenders(b, im, shape, 4, c.Endpoints()[0], name, &r)
					contend(b, lockers)
					measureHandoffs(b, lockers[:1], &r, c.Endpoints()[0], name)
				})
			}
		}
	}
}

// contend has lockers hand the lock round a hundred times, all at once as
// in handoffs, unmeasured.
func contend(b *testing.B, lockers []locker) {
	handoffs(b, lockers, 100, &latencies{})
}

// BenchmarkAfterContentionTurns is BenchmarkAfterContention's measured
// part taken in turns (interleave), so that the machine's drift reaches
// every case alike: concurrency.Mutex on one shared client (the first
// turn, which the ratios are to), and this library on one shared client,
// through a Keeper and with a client each, each on a name of its own that
// four contenders handed round a hundred times just before.
func BenchmarkAfterContentionTurns(b *testing.B) {
	for _, fs := range fsyncModes {
		b.Run("fsync="+fs.name, func(b *testing.B) {
			c := cluster(b, 1, fs.off)
			ctx := context.Background()
			cases := []struct {
				turn, shape string
				im          impl
			}{
				{"mutex", "shared", impls[1]},
				{"shared", "shared", impls[0]},
				{"keeper", "keeper", impls[0]},
				{"each", "each", impls[0]},
			}
			var turns []turn
			for _, tc := range cases {
				name := etcdproc.Name(b, "after-"+tc.turn)
				lockers := contenders(b, tc.im, tc.shape, 4, c.Endpoints()[0], name, &requests{})
				contend(b, lockers)
				lk := lockers[0]
				turns = append(turns, turn{tc.turn, func() error {
					_, _, unlock, err := lk.lock(ctx)
					if err != nil {
						return err
					}
					return unlock(ctx)
				}})
			}
			interleave(b, turns)
		})
	}
}

// BenchmarkUncontended is one Lock, one put guarded by the lock's token, and
// Unlock, with nobody else around: this library and concurrency.Mutex in
// turns (interleave), each on a client of its own; ratios are to Mutex. A
// third turn is concurrency.Mutex with its Unlock guarded as this
// library's is (a delete only if the key's creation revision is the lock's
// token, where Mutex deletes its key unconditionally): the cost of that
// guard, measured. The work=none cases leave out the put: one contender
// taking and releasing the lock, as BenchmarkHandoff's contenders=1, but
// in turns, which that benchmark (one implementation after the other)
// cannot give on a machine that drifts.
func BenchmarkUncontended(b *testing.B) {
	for _, fs := range fsyncModes {
		for _, put := range []bool{true, false} {
			work := "put"
			if !put {
				work = "none"
			}
			b.Run("fsync="+fs.name+"/work="+work, func(b *testing.B) {
				uncontendedTurns(b, fs.off, put)
			})
		}
	}
}

// uncontendedTurns runs BenchmarkUncontended's turns, with the guarded put
// between Lock and Unlock if put is set.
func uncontendedTurns(b *testing.B, fsyncOff, put bool) {
	c := cluster(b, 1, fsyncOff)
	ctx := context.Background()
	var turns []turn
	// Short names: benchstat takes the turns' metric names as units.
	names := []string{"mutex", "leasefence", "mutex-guarded-unlock"}
	for i, im := range []impl{impls[1], impls[0], guardedUnlockMutex} {
		cli := newClient(b, c.Endpoints()[0], &requests{})
		name := etcdproc.Name(b, "uncontended")
		lk := im.make(b, cli, name)
		turns = append(turns, turn{names[i], func() error {
			key, token, unlock, err := lk.lock(ctx)
			if err != nil {
				return err
			}
			if put {
				resp, err := cli.Txn(ctx).
					If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
					Then(clientv3.OpPut(name+"-data", "v")).Commit()
				if err == nil && !resp.Succeeded {
					err = fmt.Errorf("guarded put refused")
				}
				if err != nil {
					return err
				}
			}
			return unlock(ctx)
		}})
	}
	interleave(b, turns)
}

// guardedUnlockMutex is concurrency.Mutex whose Unlock deletes the key only
// if it is still the lock's (by its creation revision), in a transaction.
var guardedUnlockMutex = impl{"concurrency.Mutex+guarded-unlock", func(b *testing.B, cli *clientv3.Client, name string, _ ...lease.Option) locker {
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return guardedUnlocker{concurrency.NewMutex(s, name), cli}
}}

type guardedUnlocker struct {
	m   *concurrency.Mutex
	cli *clientv3.Client
}

func (g guardedUnlocker) lock(ctx context.Context) (string, int64, func(context.Context) error, error) {
	key, token, _, err := mutexLocker{g.m}.lock(ctx)
	if err != nil {
		return "", 0, nil, err
	}
	return key, token, func(ctx context.Context) error {
		resp, err := g.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
			Then(clientv3.OpDelete(key)).Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("guarded unlock: key %s gone", key)
		}
		return err
	}, nil
}
