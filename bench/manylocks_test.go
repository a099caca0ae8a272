package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

var (
	manyN = flag.Int("many-n", 0, "BenchmarkManyLocks and BenchmarkClientWatchCost: take this many locks (watches) "+
		"instead of their own sizes, for a quick run")
	heldProfile = flag.String("held-profile", "", "BenchmarkManyLocks and BenchmarkClientWatchCost: write a heap "+
		"profile to this directory while the locks (watches) are held, one per sub-benchmark")
)

// manyFanOut is how many locks the concurrent take of BenchmarkManyLocks
// has in flight at once.
const manyFanOut = 1000

// BenchmarkManyLocks takes n locks of different names on one session
// (fsync off) and reports the time to take them all, and
// the goroutines, heap and stack each held lock costs once all are held
// and, for leasefence, each one's own-key watch is up: this library
// against concurrency.Mutex (one concurrency.Session, a Mutex per name),
// taken one after another (serial) or all at once from manyFanOut
// goroutines (concurrent). With server=process etcd runs in a process of
// its own, so the figures are the holder's alone, as in a deployment; with
// server=embedded (10,000 only) it runs in this one, and the heap includes
// etcd's share: the keys and, for leasefence, a watcher per lock. n =
// 100,000 takes minutes; -short skips it.
func BenchmarkManyLocks(b *testing.B) {
	if *heldProfile != "" {
		runtime.MemProfileRate = 1 // every allocation, for a profile per lock
	}
	sizes := []int{10000, 100000}
	if *manyN > 0 {
		sizes = []int{*manyN}
	}
	for _, n := range sizes {
		for _, server := range []string{"process", "embedded"} {
			for _, concurrent := range []bool{false, true} {
				take := map[bool]string{false: "serial", true: "concurrent"}[concurrent]
				for _, impl := range []string{"leasefence", "mutex"} {
					b.Run(fmt.Sprintf("n=%d/server=%s/take=%s/impl=%s", n, server, take, impl), func(b *testing.B) {
						if n > 10000 && (testing.Short() || server == "embedded") {
							b.Skip("more than 10,000 locks: skipped with -short, and on the embedded server")
						}
						endpoint := watchServerEndpoint(b)
						if server == "embedded" {
							endpoint = cluster(b, 1, true).Endpoints()[0]
						}
						for i := 0; i < b.N; i++ {
							manyLocksOnce(b, endpoint, n, concurrent, impl == "leasefence")
						}
					})
				}
			}
		}
	}
}

// holder takes locks of one session, releases them (unlock, nil if
// closing the session is enough) and closes it.
type holder struct {
	lock   func(ctx context.Context, name string) (held any, err error)
	unlock func(ctx context.Context, held any) error
	close  func() error
}

func leasefenceHolder(b *testing.B, cli *clientv3.Client) holder {
	s, err := lease.NewSession(context.Background(), cli)
	if err != nil {
		b.Fatal(err)
	}
	return holder{
		lock:   func(ctx context.Context, name string) (any, error) { return s.Lock(ctx, name) },
		unlock: func(ctx context.Context, held any) error { return held.(*lease.Lock).Unlock(ctx) },
		close:  s.Close,
	}
}

func mutexHolder(b *testing.B, cli *clientv3.Client) holder {
	s, err := concurrency.NewSession(cli)
	if err != nil {
		b.Fatal(err)
	}
	return holder{
		lock: func(ctx context.Context, name string) (any, error) {
			m := concurrency.NewMutex(s, name)
			return m, m.Lock(ctx)
		},
		close: s.Close,
	}
}

func manyLocksOnce(b *testing.B, endpoint string, n int, concurrent, leasefence bool) {
	var r requests
	cli := newClient(b, endpoint, &r)
	h := mutexHolder
	if leasefence {
		h = leasefenceHolder
	}
	locker := h(b, cli)
	// The names and the slice that keeps the locks are the benchmark's,
	// made before the first reading.
	prefix := etcdproc.Name(b, "many")
	names := make([]string, n)
	for j := range names {
		names[j] = fmt.Sprintf("%s/%d", prefix, j)
	}
	held := make([]any, n)
	created, unary := r.created.Load(), r.unary.Load()
	if concurrent {
		// The runtime keeps a goroutine's descriptor for reuse once it
		// ends, never freeing it: the fan-out's own are the benchmark's,
		// not the locks', so they are made before the first reading.
		warmGoroutines(manyFanOut)
	}
	before := quiet(b)
	start := time.Now()
	err := forEach(n, concurrent, func(j int) (err error) {
		held[j], err = locker.lock(context.Background(), names[j])
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	// A leasefence lock opens the watch of its key once held for 50 ms:
	// wait for every one to be up, then for the goroutines to settle.
	watches := 0
	if leasefence {
		watches = n
	}
	limit := 30*time.Second + time.Duration(n)*time.Millisecond
	// As its watch comes up a lock reads its key again (recheck), so the
	// requests must have stopped too: a read in flight is not held.
	if !settle(limit, func() bool { return r.created.Load()-created >= int64(watches) }, r.unary.Load) {
		b.Logf("not settled after %v: %d of %d watches up, measured anyway", limit, r.created.Load()-created, watches)
	}
	after := memory()
	writeHeldProfile(b, "held")
	reportHeld(b, before, after, n, "lock")
	b.ReportMetric(took.Seconds(), "s-to-take-all")
	b.ReportMetric(float64(r.created.Load()-created)/float64(n), "watches/lock")
	b.ReportMetric(float64(r.unary.Load()-unary)/float64(n), "unary/lock") // the reads as watches come up included
	// Unlock one by one before Close. Close ends every lock's watch at
	// once: with 100,000 that is 100,000 cancel requests on one clientv3
	// watch stream, which deadlocks it against etcd 3.7.3 (the client's
	// loop blocked sending a cancel, the server's blocked queueing the
	// answer to the one before; etcd-io/etcd#20716), and Close never
	// returns. One by one the watches end at the pace of the unlocks.
	if locker.unlock != nil {
		if err := forEach(n, false, func(j int) error { return locker.unlock(context.Background(), held[j]) }); err != nil {
			b.Fatal(err)
		}
	}
	if err := locker.close(); err != nil {
		b.Fatal(err)
	}
}

// forEach calls f for 0 to n-1, one after another, or concurrent from
// manyFanOut goroutines; it returns the first error.
func forEach(n int, concurrent bool, f func(int) error) error {
	if !concurrent {
		for j := 0; j < n; j++ {
			if err := f(j); err != nil {
				return err
			}
		}
		return nil
	}
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range min(manyFanOut, n) {
		wg.Go(func() {
			for j := int(next.Add(1) - 1); j < n; j = int(next.Add(1) - 1) {
				if err := f(j); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// settle waits, at most limit, until ready reports true and then the
// number of goroutines, and each count in still, has not changed for half
// a second; it reports whether that happened in time.
func settle(limit time.Duration, ready func() bool, still ...func() int64) bool {
	const quiet = 500 * time.Millisecond
	deadline := time.Now().Add(limit)
	for !ready() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	now := func() []int64 {
		v := []int64{int64(runtime.NumGoroutine())}
		for _, f := range still {
			v = append(v, f())
		}
		return v
	}
	last, since := now(), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
		if v := now(); !slices.Equal(v, last) {
			last, since = v, time.Now()
		}
	}
	return true
}

// warmGoroutines has n goroutines run at once and end, so that the
// runtime has made the descriptors it keeps for reuse.
func warmGoroutines(n int) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() { <-start })
	}
	close(start)
	wg.Wait()
}

// reportHeld reports what each of n things held costs between before and
// after: goroutines, heap, stack, and heap and stack together.
func reportHeld(b *testing.B, before, after usage, n int, unit string) {
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	heap, stack := per(after.heap, before.heap), per(after.stack, before.stack)
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/"+unit)
	b.ReportMetric(heap, "heapB/"+unit)
	b.ReportMetric(stack, "stackB/"+unit)
	b.ReportMetric(heap+stack, "totalB/"+unit)
}

// quiet waits, at most 30 s, for what earlier runs left to end (the
// goroutine count settles) and returns the reading before a measurement;
// with -held-profile it writes the heap profile of that moment too.
func quiet(b *testing.B) usage {
	if !settle(30*time.Second, func() bool { return true }) {
		b.Log("goroutines not settled before the run after 30 s")
	}
	u := memory()
	writeHeldProfile(b, "before")
	return u
}

// writeHeldProfile writes a heap profile named after b and when to
// -held-profile, if set.
func writeHeldProfile(b *testing.B, when string) {
	if *heldProfile == "" {
		return
	}
	if err := os.MkdirAll(*heldProfile, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(fmt.Sprintf("%s/%s.%s.pprof", *heldProfile, sanitize(b.Name()), when))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// watchServer is the etcd BenchmarkClientWatchCost runs against: a
// process of its own (fsync off), so that the heap, stack and goroutines
// measured are the client's alone.
var watchServer struct {
	once sync.Once
	c    *etcdproc.Cluster
	err  error
}

func closeWatchServer() {
	if watchServer.c != nil {
		watchServer.c.Close()
	}
}

func watchServerEndpoint(b *testing.B) string {
	watchServer.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		watchServer.c, watchServer.err = etcdproc.Start(ctx, etcdproc.Config{NoFsync: true})
	})
	if watchServer.err != nil {
		b.Fatalf("start etcd: %v", watchServer.err)
	}
	return watchServer.c.Endpoints()[0]
}

// BenchmarkClientWatchCost opens n watches of distinct keys on one
// clientv3.Client and reports what etcd's client spends per watch once
// all are up: goroutines, heap and stack. With server=process etcd runs in
// a process of its own (fsync off), so the figures are the client's alone;
// with server=embedded it runs in this one as for BenchmarkManyLocks, and
// the difference is etcd's own cost of a watcher. api=clientv3 opens them
// with Client.Watch (WithCreatedNotify, each channel read for its created
// response, no reader left on it); api=grpc-stream sends n
// WatchCreateRequests on one stream of etcd's generated gRPC watch client,
// with one goroutine receiving: what sharing one stream would cost, before
// any bookkeeping of its own.
func BenchmarkClientWatchCost(b *testing.B) {
	n := 10000
	if *manyN > 0 {
		n = *manyN
	}
	for _, server := range []string{"process", "embedded"} {
		for _, api := range []string{"clientv3", "grpc-stream"} {
			b.Run(fmt.Sprintf("n=%d/server=%s/api=%s", n, server, api), func(b *testing.B) {
				endpoint := watchServerEndpoint(b)
				if server == "embedded" {
					endpoint = cluster(b, 1, true).Endpoints()[0]
				}
				for i := 0; i < b.N; i++ {
					watchCostOnce(b, endpoint, n, api == "clientv3")
				}
			})
		}
	}
}

func watchCostOnce(b *testing.B, endpoint string, n int, viaClient bool) {
	var r requests
	cli := newClient(b, endpoint, &r)
	prefix := etcdproc.Name(b, "watch")
	keys := make([]string, n)
	for j := range keys {
		keys[j] = fmt.Sprintf("%s/%d", prefix, j)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := quiet(b)
	start := time.Now()
	if viaClient {
		clientWatches(b, ctx, cli, keys)
	} else {
		streamWatches(b, ctx, cli, keys)
	}
	took := time.Since(start)
	if !settle(30*time.Second, func() bool { return true }) {
		b.Log("goroutines not settled after 30 s, measured anyway")
	}
	after := memory()
	writeHeldProfile(b, "held")
	reportHeld(b, before, after, n, "watch")
	b.ReportMetric(took.Seconds(), "s-to-open-all")
	b.ReportMetric(float64(r.created.Load())/float64(n), "created/watch")
	runtime.KeepAlive(keys)
}

// clientWatches opens a clientv3 watch of each key and waits until each
// is created.
func clientWatches(b *testing.B, ctx context.Context, cli *clientv3.Client, keys []string) {
	chans := make([]clientv3.WatchChan, len(keys))
	for j, k := range keys {
		chans[j] = cli.Watch(ctx, k, clientv3.WithCreatedNotify())
	}
	for _, ch := range chans {
		if wr := <-ch; !wr.Created || wr.Err() != nil {
			b.Fatalf("watch not created: %v", wr.Err())
		}
	}
}

// streamWatches sends a create request for each key on one gRPC watch
// stream and waits, on one receiving goroutine, until all are created. The
// goroutine stays, as a shared stream's would; ctx's end stops it.
func streamWatches(b *testing.B, ctx context.Context, cli *clientv3.Client, keys []string) {
	stream, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(ctx)
	if err != nil {
		b.Fatal(err)
	}
	allCreated := make(chan error, 1)
	go func() {
		created := 0
		for {
			resp, err := stream.Recv()
			if err != nil {
				if created < len(keys) {
					allCreated <- err
				}
				return
			}
			if resp.Created {
				if created++; created == len(keys) {
					allCreated <- nil
				}
			}
		}
	}()
	for _, k := range keys {
		req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
			CreateRequest: &pb.WatchCreateRequest{Key: []byte(k)}}}
		if err := stream.Send(req); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-allCreated; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLabManyLocks is BenchmarkManyLocks's concurrent take of n
// locks (10,000 unless -many-n) on the three-member lab at 1 ms round
// trip (0.5 ms each way on every link, fsync on), with the client on
// the leader: what taking many at once costs where each request pays a
// network round trip.
func BenchmarkLabManyLocks(b *testing.B) {
	n := 10000
	if *manyN > 0 {
		n = *manyN
	}
	for _, impl := range []string{"leasefence", "mutex"} {
		b.Run(fmt.Sprintf("n=%d/rtt=1ms/take=concurrent/impl=%s", n, impl), func(b *testing.B) {
			l := theLab(b)
			l.SetDelay(500*time.Microsecond, 500*time.Microsecond)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			leader, err := l.Leader(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				manyLocksOnce(b, l.Endpoint(leader), n, true, impl == "leasefence")
			}
		})
	}
}
