package bench

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/leasefence/leasefence/lease"
)

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
	runtime.GC() // a second collection returns stack spans the first left (5 MB after 1,000 goroutines ended)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return usage{m.HeapAlloc, m.StackInuse, runtime.NumGoroutine()}
}
