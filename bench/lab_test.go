package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/chaos/rttlab"
	"github.com/leasefence/leasefence/lease"
)

// labDelays are the one-way delays the lab benchmarks run at: round trips
// of 0.2 ms and 1 ms inside a zone and 5 ms across zones.
var labDelays = []time.Duration{100 * time.Microsecond, 500 * time.Microsecond, 2500 * time.Microsecond}

// lab is the three-member lab, started on first use, with fsync on.
var lab struct {
	once sync.Once
	l    *rttlab.Lab
	err  error
}

func theLab(b *testing.B) *rttlab.Lab {
	b.Helper()
	lab.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		lab.l, lab.err = rttlab.Start(ctx, rttlab.Config{Members: 3, Client: labDelays[0], Peer: labDelays[0]})
	})
	if lab.err != nil {
		b.Fatal(lab.err)
	}
	return lab.l
}

// closeLab stops the lab if a benchmark started it.
func closeLab() {
	if lab.l != nil {
		lab.l.Close()
	}
}

// labClient is a client on the leader or a follower of the lab, its
// requests counted into r.
func labClient(b *testing.B, l *rttlab.Lab, onLeader bool, r *requests) *clientv3.Client {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	i, err := l.Leader(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if !onLeader {
		i = (i + 1) % 3
	}
	return newClient(b, l.Endpoint(i), r)
}

// steps times each named step of a round, over all rounds, and counts
// the unary requests each made: all of them finish before the step
// returns, so they are its critical path.
type steps struct {
	took map[string][]time.Duration
	rpcs map[string]int64
	r    *requests
}

func newSteps(r *requests) *steps {
	return &steps{took: map[string][]time.Duration{}, rpcs: map[string]int64{}, r: r}
}

func (s *steps) time(name string, f func() error) error {
	before := s.r.unary.Load()
	start := time.Now()
	err := f()
	s.took[name] = append(s.took[name], time.Since(start))
	s.rpcs[name] += s.r.unary.Load() - before
	return err
}

func pct(d []time.Duration, p float64) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[int(p*float64(len(d)-1))]
}

// report gives each step's p50 and p99 in microseconds, and its p50 as a
// multiple of the plain put's.
func (s *steps) report(b *testing.B) {
	put := pct(s.took["put"], 0.5)
	for name, d := range s.took {
		b.ReportMetric(float64(pct(d, 0.5).Microseconds()), name+"-p50-us")
		b.ReportMetric(float64(pct(d, 0.99).Microseconds()), name+"-p99-us")
		if name != "put" {
			b.ReportMetric(float64(pct(d, 0.5))/float64(put), name+"-x-put")
		}
		if n, ok := s.rpcs[name]; ok && s.r != nil {
			b.ReportMetric(float64(n)/float64(len(d)), name+"-rpcs")
		}
	}
}

// BenchmarkLabUncontended: on three etcd processes with real round trips
// and fsync on, a client on the leader or a follower takes and releases
// an uncontended lock, and writes under it, beside a plain put and
// concurrency.Mutex, interleaved round by round.
func BenchmarkLabUncontended(b *testing.B) {
	for _, oneWay := range labDelays {
		for _, side := range []string{"leader", "follower"} {
			b.Run(fmt.Sprintf("rtt=%v/client=%s", 2*oneWay, side), func(b *testing.B) {
				l := theLab(b)
				l.SetDelay(oneWay, oneWay)
				var r requests
				uncontended(b, labClient(b, l, side == "leader", &r), &r)
			})
		}
	}
}

func uncontended(b *testing.B, cli *clientv3.Client, r *requests) {
	ctx := context.Background()
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	cs, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	name := fmt.Sprintf("bench/lab/%d", time.Now().UnixNano())
	mu := concurrency.NewMutex(cs, name+"-mutex")
	st := newSteps(r)
	b.ResetTimer()
	for range b.N {
		err := st.time("put", func() error { _, err := cli.Put(ctx, name+"-plain", "x"); return err })
		var lk *lease.Lock
		err = firstErr(err, st.time("lock", func() (err error) { lk, err = s.Lock(ctx, name); return err }))
		if err == nil {
			err = st.time("guarded-put", func() error {
				_, err := fence.NewTxn(ctx, cli, fence.Held(lk)).Then(clientv3.OpPut(name+"-data", "x")).Commit()
				return err
			})
			err = firstErr(err, st.time("unlock", func() error { return lk.Unlock(ctx) }))
		}
		err = firstErr(err, st.time("mutex-lock", func() error { return mu.Lock(ctx) }))
		err = firstErr(err, st.time("mutex-unlock", func() error { return mu.Unlock(ctx) }))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st.report(b)
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
