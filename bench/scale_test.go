package bench

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// BenchmarkManyLocks takes 10,000 locks of different names on one session
// (fsync off) and reports the time to take them all, and the heap, stack
// and goroutines each held lock costs. One lease serves them all.
func BenchmarkManyLocks(b *testing.B) {
	const n = 10000
	endpoint := cluster(b, 1, true).Endpoints()[0]
	for i := 0; i < b.N; i++ {
		var r requests
		cli := newClient(b, endpoint, &r)
		s, err := lease.NewSession(context.Background(), cli)
		if err != nil {
			b.Fatal(err)
		}
		prefix := etcdproc.Name(b, "many")
		before := memory()
		start := time.Now()
		locks := make([]*lease.Lock, n)
		for j := range locks {
			if locks[j], err = s.Lock(context.Background(), fmt.Sprintf("%s/%d", prefix, j)); err != nil {
				b.Fatal(err)
			}
		}
		took := time.Since(start)
		// Each lock opens the watch of its key once held for 50 ms: count
		// what a held lock costs once they are all up (two goroutines each
		// when they are), waiting at most 30 s.
		for deadline := time.Now().Add(30 * time.Second); runtime.NumGoroutine()-before.goroutines < 2*n && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		after := memory()
		b.ReportMetric(took.Seconds(), "s-to-take-all")
		b.ReportMetric(float64(after.heap-before.heap)/n, "heapB/lock")
		b.ReportMetric(float64(after.stack-before.stack)/n, "stackB/lock")
		b.ReportMetric(float64(after.goroutines-before.goroutines)/n, "goroutines/lock")
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkManySessions opens 1,000 sessions on one client (fsync off),
// holds them idle for three keep-alive periods, and reports what each costs:
// keep-alive streams, goroutines, heap and stack, and the CPU (client and
// server, in this process) per second of keep-alive traffic; each session
// on its own stream, and all of them through one Keeper.
func BenchmarkManySessions(b *testing.B) {
	const n = 1000
	ttl := 3 * time.Second
	for _, viaKeeper := range []bool{false, true} {
		impl := map[bool]string{false: "own-streams", true: "keeper"}[viaKeeper]
		b.Run("impl="+impl, func(b *testing.B) {
			endpoint := cluster(b, 1, true).Endpoints()[0]
			for i := 0; i < b.N; i++ {
				var r requests
				cli := newClient(b, endpoint, &r)
				before := memory()
				opts := []lease.Option{lease.WithTTL(ttl)}
				var k *lease.Keeper
				if viaKeeper {
					var err error
					if k, err = lease.NewKeeper(cli); err != nil {
						b.Fatal(err)
					}
					opts = append(opts, lease.WithKeeper(k))
				}
				sessions := make([]*lease.Session, n)
				for j := range sessions {
					var err error
					if sessions[j], err = lease.NewSession(context.Background(), cli, opts...); err != nil {
						b.Fatal(err)
					}
				}
				after := memory()
				idle := 3 * ttl
				msgs, cpu := r.read(), cpuTime()
				time.Sleep(idle) // the measured window: the sessions' own keep-alives run in it
				cpuPerSec := float64((cpuTime() - cpu).Milliseconds()) / idle.Seconds()
				now := r.read()
				b.ReportMetric(float64(r.streams.Load())/n, "streams/session")
				b.ReportMetric(float64(after.goroutines-before.goroutines)/n, "goroutines/session")
				b.ReportMetric(float64(after.heap-before.heap)/n, "heapB/session")
				b.ReportMetric(float64(after.stack-before.stack)/n, "stackB/session")
				b.ReportMetric(cpuPerSec, "cpu-ms/s")
				b.ReportMetric(float64(now.sent-msgs.sent)/idle.Seconds(), "keepalives/s")
				for _, s := range sessions {
					if s.Err() != nil {
						b.Fatalf("a session ended while idle: %v", s.Err())
					}
					if err := s.Close(); err != nil {
						b.Fatal(err)
					}
				}
				if k != nil {
					if err := k.Close(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

type usage struct {
	heap, stack uint64
	goroutines  int
}

func memory() usage {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return usage{m.HeapAlloc, m.StackInuse, runtime.NumGoroutine()}
}
