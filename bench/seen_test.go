package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// BenchmarkDeletionSeen measures how soon a held lock learns that another
// client deleted its key: from sending the delete to the lock's Done,
// once the lock has held long enough for its own-key watch to be up (the
// watch opens 50 ms after an uncontended grant); the delete's own round
// trip is reported beside it, as the floor. With held=10000 the session
// holds 9,999 other locks meanwhile, whose watches share its stream (or,
// before that, its client's). etcd runs in a process of its own, fsync
// off. Reported: p50 and p99 in µs, over b.N deletions.
func BenchmarkDeletionSeen(b *testing.B) {
	for _, held := range []int{1, 10000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			if held > 1 && testing.Short() {
				b.Skip("10,000 locks: skipped with -short")
			}
			deletionSeen(b, watchServerEndpoint(b), held)
		})
	}
}

func deletionSeen(b *testing.B, endpoint string, held int) {
	ctx := context.Background()
	var r requests
	cli := newClient(b, endpoint, &r)
	other := newClient(b, endpoint, &requests{})
	s, err := lease.NewSession(ctx, cli)
	if err != nil {
		b.Fatal(err)
	}
	prefix := etcdproc.Name(b, "seen")
	background := make([]*lease.Lock, held-1)
	created := r.created.Load()
	if err := forEach(len(background), true, func(j int) (err error) {
		background[j], err = s.Lock(ctx, fmt.Sprintf("%s/bg/%d", prefix, j))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	if !settle(time.Minute, func() bool { return r.created.Load()-created >= int64(len(background)) }) {
		b.Fatal("the background locks' watches did not come up in a minute")
	}
	var seen, rtt []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		before := r.created.Load()
		l, err := s.Lock(ctx, fmt.Sprintf("%s/k/%d", prefix, i))
		if err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); r.created.Load() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("the own-key watch did not come up in 10 s")
			}
		}
		b.StartTimer()
		start := time.Now()
		if _, err := other.Delete(ctx, l.Key()); err != nil {
			b.Fatal(err)
		}
		rtt = append(rtt, time.Since(start))
		select {
		case <-l.Done():
			seen = append(seen, time.Since(start))
		case <-time.After(10 * time.Second):
			b.Fatal("the deletion was not seen in 10 s")
		}
	}
	b.StopTimer()
	slices.Sort(seen)
	slices.Sort(rtt)
	b.ReportMetric(float64(seen[len(seen)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(seen[len(seen)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(rtt[len(rtt)/2].Microseconds()), "delete-p50-µs")
	if err := forEach(len(background), true, func(j int) error { return background[j].Unlock(ctx) }); err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}
