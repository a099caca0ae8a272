// Package bench holds the side-by-side benchmarks: this library against
// etcd's concurrency.Mutex and against the commit bound (1 / median plain
// put), in the same run, on embedded etcd members with fsync off (the
// protocol's own cost) and on (a deployment's), with contenders on one
// shared client and on a client each. It has no tests; `go test ./...`
// starts nothing here. See bench/plot for the pictures.
package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdtest"
)

var latencyDir = flag.String("latency-dir", "", "write each benchmark's acquire latencies (ns, one per line) to a file in this directory")

// clusters are started on first use and stopped when the run ends, so that
// a `go test ./...` without -bench starts none.
var clusters struct {
	mu      sync.Mutex
	started map[string]*etcdtest.Cluster
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	clusters.mu.Lock()
	for _, c := range clusters.started {
		c.Close()
	}
	clusters.mu.Unlock()
	closeLab()
	closeWatchServer()
	os.Exit(code)
}

// fsyncModes are the two ways every figure is taken.
var fsyncModes = []struct {
	name string
	off  bool
}{{"off", true}, {"on", false}}

// cluster returns the embedded cluster of the given size and fsync mode,
// started once per run.
func cluster(b *testing.B, members int, noFsync bool) *etcdtest.Cluster {
	b.Helper()
	key := fmt.Sprintf("%d/%v", members, noFsync)
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	if c, ok := clusters.started[key]; ok {
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := etcdtest.Start(ctx, etcdtest.Config{Members: members, NoFsync: noFsync})
	if err != nil {
		b.Fatalf("start etcd: %v", err)
	}
	if clusters.started == nil {
		clusters.started = map[string]*etcdtest.Cluster{}
	}
	clusters.started[key] = c
	return c
}

// requests counts what clients send and receive: unary calls, and messages
// on streams (watch and keep-alive) in each direction; and the watches
// etcd reported created.
type requests struct {
	unary, sent, received, streams, created atomic.Int64
}

func (r *requests) dialOptions() []grpc.DialOption {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		r.unary.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		r.streams.Add(1)
		return countedStream{s, r}, nil
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}
}

type countedStream struct {
	grpc.ClientStream
	r *requests
}

func (s countedStream) SendMsg(m any) error {
	s.r.sent.Add(1)
	return s.ClientStream.SendMsg(m)
}

func (s countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.r.received.Add(1)
		if w, ok := m.(*pb.WatchResponse); ok && w.Created {
			s.r.created.Add(1)
		}
	}
	return err
}

// snapshot is a reading of the counters.
type snapshot struct{ unary, sent, received int64 }

func (r *requests) read() snapshot {
	return snapshot{r.unary.Load(), r.sent.Load(), r.received.Load()}
}

// report adds the requests made since before, per operation, to b's
// metrics.
func (r *requests) report(b *testing.B, before snapshot, ops int) {
	reportRequests(b, before, r.read(), ops)
}

// sumRead is the sum of the counters of rs.
func sumRead(rs []requests) snapshot {
	var s snapshot
	for i := range rs {
		n := rs[i].read()
		s.unary, s.sent, s.received = s.unary+n.unary, s.sent+n.sent, s.received+n.received
	}
	return s
}

// reportRequests adds the requests made from before to now, per
// operation, to b's metrics.
func reportRequests(b *testing.B, before, now snapshot, ops int) {
	per := func(n int64) float64 { return float64(n) / float64(ops) }
	b.ReportMetric(per(now.unary-before.unary), "unary/op")
	b.ReportMetric(per(now.sent-before.sent+now.received-before.received), "streammsgs/op")
}

// newClient opens a client to c's first member (or to member i), counting
// its requests into r, closed when b ends.
func newClient(b testing.TB, endpoint string, r *requests) *clientv3.Client {
	b.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: r.dialOptions(),
	})
	if err != nil {
		b.Fatalf("etcd client: %v", err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

// commitBound measures the commit bound on cli: 1 / the median latency of
// sequential plain puts, in puts per second.
func commitBound(b *testing.B, cli *clientv3.Client, key string) float64 {
	b.Helper()
	const n = 500
	lat := make([]time.Duration, n)
	for i := range lat {
		start := time.Now()
		if _, err := cli.Put(context.Background(), key, "v"); err != nil {
			b.Fatalf("put: %v", err)
		}
		lat[i] = time.Since(start)
	}
	return float64(time.Second) / float64(median(lat))
}

// cpuTime is the CPU time the process (client and embedded server alike)
// has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// latencies collects durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// report adds the median and 99th percentile to b's metrics and, with
// -latency-dir, writes every sample to a file named after the benchmark.
func (l *latencies) report(b *testing.B) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	q := func(p float64) float64 { return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	if *latencyDir == "" {
		return
	}
	f, err := os.Create(fmt.Sprintf("%s/%s.txt", *latencyDir, sanitize(b.Name())))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for _, d := range l.d {
		fmt.Fprintln(f, d.Nanoseconds())
	}
}

func sanitize(name string) string {
	out := []rune(name)
	for i, r := range out {
		if r == '/' || r == '=' || r == ' ' {
			out[i] = '_'
		}
	}
	return string(out)
}
