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

	"github.com/leasefence/leasefence/internal/chaos/rttlab"
	"github.com/leasefence/leasefence/lease"
)

// labLocker is one contender's lock, of either kind.
type labLocker interface {
	lock(ctx context.Context) error
	unlock(ctx context.Context) error
	close()
}

type labLease struct {
	s    *lease.Session
	name string
	l    *lease.Lock
}

func (k *labLease) lock(ctx context.Context) (err error) {
	k.l, err = k.s.Lock(ctx, k.name)
	return err
}
func (k *labLease) unlock(ctx context.Context) error { return k.l.Unlock(ctx) }
func (k *labLease) close()                           { k.s.Close() }

type labMutex struct {
	s *concurrency.Session
	m *concurrency.Mutex
}

func (k *labMutex) lock(ctx context.Context) error   { return k.m.Lock(ctx) }
func (k *labMutex) unlock(ctx context.Context) error { return k.m.Unlock(ctx) }
func (k *labMutex) close()                           { k.s.Close() }

// BenchmarkLabHandoff: contenders on the leader or a follower of the lab
// pass one lock around; the figure is the time from the holder's Unlock
// call to the next holder's Lock returning. Each contender has a client
// of its own, as processes of their own would (impl=leasefence, mutex),
// or all share one client and one lease.Keeper, as the workers of one
// service would (impl=keeper).
func BenchmarkLabHandoff(b *testing.B) {
	for _, oneWay := range labDelays {
		for _, side := range []string{"leader", "follower"} {
			for _, n := range []int{2, 4, 16} {
				for _, impl := range []string{"leasefence", "keeper", "mutex"} {
					b.Run(fmt.Sprintf("rtt=%v/client=%s/contenders=%d/impl=%s", 2*oneWay, side, n, impl), func(b *testing.B) {
						l := theLab(b)
						l.SetDelay(oneWay, oneWay)
						labHandoffs(b, l, side == "leader", n, impl)
					})
				}
			}
		}
	}
}

// labLockers are n contenders of impl on name, the requests of contender
// i counted into own[i] (all into own[0] for a Keeper's, which share a
// client).
func labLockers(b *testing.B, l *rttlab.Lab, onLeader bool, impl, name string, own []requests) []labLocker {
	b.Helper()
	lockers := make([]labLocker, len(own))
	if impl != "keeper" {
		for i := range lockers {
			lockers[i] = newLocker(b, labClient(b, l, onLeader, &own[i]), impl, name)
		}
		return lockers
	}
	cli := labClient(b, l, onLeader, &own[0])
	k, err := lease.NewKeeper(cli)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { k.Close() }) // after the sessions, closed by labHandoffs
	for i := range lockers {
		s, err := lease.NewSession(context.Background(), cli, lease.WithKeeper(k))
		if err != nil {
			b.Fatal(err)
		}
		lockers[i] = &labLease{s: s, name: name}
	}
	return lockers
}

func newLocker(b *testing.B, cli *clientv3.Client, impl, name string) labLocker {
	b.Helper()
	if impl == "mutex" {
		s, err := concurrency.NewSession(cli)
		if err != nil {
			b.Fatal(err)
		}
		return &labMutex{s: s, m: concurrency.NewMutex(s, name)}
	}
	s, err := lease.NewSession(context.Background(), cli)
	if err != nil {
		b.Fatal(err)
	}
	return &labLease{s: s, name: name}
}

func labHandoffs(b *testing.B, l *rttlab.Lab, onLeader bool, n int, impl string) {
	name := fmt.Sprintf("bench/labhandoff/%d", time.Now().UnixNano())
	var pr requests
	own := make([]requests, n)
	lockers := labLockers(b, l, onLeader, impl, name, own)
	for _, k := range lockers {
		defer k.close()
	}
	put := newSteps(&pr)
	cli := labClient(b, l, onLeader, &pr)
	for range 20 {
		if err := put.time("put-idle", func() error { _, err := cli.Put(context.Background(), name+"-plain", "x"); return err }); err != nil {
			b.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		samples []time.Duration
		unlocks []time.Duration
		// atCommit: each contender's requests as the last Unlock
		// returned, which is when its delete was committed, give or take a
		// one-way trip; committed tells that it has. A next holder's
		// requests after that, to its grant, are on the handoff's critical
		// path; those it made before overlapped the commit.
		atCommit   = make([]int64, n)
		committed  bool
		critical   int64
		releasedAt atomic.Int64 // UnixNano of the last Unlock call; 0 before the first
		left       atomic.Int64
		wg         sync.WaitGroup
		failed     atomic.Value
	)
	left.Store(int64(b.N))
	before := sumRead(own)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ResetTimer()
	// The plain put is measured in the same run, under the same load: a
	// probe on a client of its own puts, rests as long as the put took,
	// and puts again, until the handoffs are done.
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for ctx.Err() == nil {
			start := time.Now()
			if err := put.time("put", func() error { _, err := cli.Put(ctx, name+"-plain", "x"); return err }); err != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Since(start)):
			}
		}
	}()
	for i, k := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Load() > 0 {
				if err := k.lock(ctx); err != nil {
					if ctx.Err() == nil {
						failed.Store(err)
						cancel()
					}
					return
				}
				if at := releasedAt.Load(); at != 0 {
					d := time.Since(time.Unix(0, at))
					mu.Lock()
					samples = append(samples, d)
					if committed {
						critical += own[i].unary.Load() - atCommit[i]
					}
					mu.Unlock()
				}
				left.Add(-1)
				mu.Lock()
				committed = false
				mu.Unlock()
				at := time.Now()
				releasedAt.Store(at.UnixNano())
				if err := k.unlock(ctx); err != nil {
					failed.Store(err)
					cancel()
					return
				}
				took := time.Since(at)
				mu.Lock()
				unlocks = append(unlocks, took)
				if releasedAt.Load() == at.UnixNano() { // not granted on yet
					for j := range own {
						atCommit[j] = own[j].unary.Load()
					}
					committed = true
				}
				mu.Unlock()
			}
		}()
	}
	// The last holder's waiters are still queued: release them.
	wg.Wait()
	b.StopTimer()
	cancel()
	<-probeDone
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	if len(samples) > 0 {
		st := newSteps(nil)
		st.took["handoff"], st.took["put"], st.took["put-idle"], st.took["unlock"] = samples, put.took["put"], put.took["put-idle"], unlocks
		st.report(b)
		b.ReportMetric(float64(pct(samples, 0.5)-pct(put.took["put"], 0.5))/1e3, "handoff-over-put-us")
		// Every request of every contender, per handoff: what the whole
		// queue costs etcd for one change of holder.
		reportRequests(b, before, sumRead(own), len(samples))
		if impl != "keeper" {
			// On the critical path: the Unlock's request, and those the
			// next holder made from the commit to its grant.
			b.ReportMetric(1+float64(critical)/float64(len(samples)), "critical-rpcs")
		}
	}
}
