package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

// BenchmarkManifest measures objectfence on a real versitygw gateway on
// loopback, started once for the run, each case on a manifest key of its
// own.
//
// uncontended: one holder's Commit on the manifest its previous commit
// returned (one conditional put), a plain unconditional PutObject of the
// same bytes to a key of its own (over the manifest it would replace the
// holder's base), and a Read, in turns (interleave): commit/plain is the
// fence's cost, whose target is at most 2.2x. gets/commit and puts/commit
// count what the commits sent.
//
// committers=N: N goroutines commit to one manifest, each commit by a new
// holder: a Claim with a token of its own drawn from one counter (so
// tokens increase in the order drawn, not in the order claims land), then
// a Commit on what the claim returned, in rounds of 4N commits that
// alternate with rounds of 4N plain puts by N goroutines (to a key of
// their own, so as not to move the fenced manifest's token back), each
// kind going first every other time. It reports commits/s (commits
// written per second of the fenced rounds), plain-puts/s, commit/plain
// (the median over pairs of rounds of the fenced round's time over the
// plain one's), and per attempted commit: stale/op (its claim or commit
// refused with a *fence.StaleError, a higher token having landed first),
// retries/op (conditional puts refused by a race: a claim's, sent back to
// a new read, or a commit's, which then reads why) and contended/op
// (claims or commits that gave up with ErrContended). After the run the
// manifest must hold the highest token that claimed it.
func BenchmarkManifest(b *testing.B) {
	srv, bucket := s3test.StartVersityT(b)
	client := s3.New(srv.Client().Options(), func(o *s3.Options) {
		// Room for every committer's connection between requests: the
		// SDK's default keeps 10 per host and closes the rest.
		o.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConnsPerHost = 64
		})
	})
	store, err := objectfence.NewS3Store(client, bucket)
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	key := func(name string) string { return fmt.Sprintf("%s-%d/manifest", name, seq.Add(1)) }
	b.Run("uncontended", func(b *testing.B) {
		manifestUncontended(b, store, key("uncontended"))
	})
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("committers=%d", n), func(b *testing.B) {
			manifestContended(b, store, key(fmt.Sprintf("committers%d", n)), n)
		})
	}
}

// countingStore counts what a Fence sends: reads, conditional puts, and
// the puts refused because another write came between read and put.
type countingStore struct {
	objectfence.Store
	gets, puts, raced atomic.Int64
}

func (s *countingStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, key)
}

func (s *countingStore) Put(ctx context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	s.puts.Add(1)
	v, err := s.Store.Put(ctx, key, body, cond)
	if errors.Is(err, objectfence.ErrPreconditionFailed) || errors.Is(err, objectfence.ErrConflict) {
		s.raced.Add(1)
	}
	return v, err
}

// manifestLock is the lock whose tokens fence the benchmarks' manifests.
const manifestLock = "bench/manifest"

// manifestFence is a checked Fence on key through a counting store, with
// a first claim and commit of token written; it returns the manifest that
// commit returned, the base of the next, and the manifest object's bytes
// as it left them.
func manifestFence(b *testing.B, store objectfence.Store, key string, token int64) (*objectfence.Fence, *countingStore, objectfence.Manifest, []byte) {
	b.Helper()
	ctx := context.Background()
	counted := &countingStore{Store: store}
	f, err := objectfence.New(counted, key, manifestLock)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Check(ctx); err != nil {
		b.Fatal(err)
	}
	claimed, err := f.Claim(ctx, token)
	if err != nil {
		b.Fatal(err)
	}
	base, err := f.Commit(ctx, claimed, batchPointer(b, f, token))
	if err != nil {
		b.Fatal(err)
	}
	body, _, err := store.Get(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	return f, counted, base, body
}

// batchPointer is a manifest's payload: the data key of a batch.
func batchPointer(b *testing.B, f *objectfence.Fence, token int64) []byte {
	k, err := f.DataKey(token, "batch-000001.parquet")
	if err != nil {
		b.Fatal(err)
	}
	return []byte(k)
}

func manifestUncontended(b *testing.B, store objectfence.Store, key string) {
	ctx := context.Background()
	const token = 7
	f, counted, base, body := manifestFence(b, store, key, token)
	reader, err := objectfence.New(store, key, manifestLock)
	if err != nil {
		b.Fatal(err)
	}
	payload := batchPointer(b, f, token)
	plainKey := key + ".plain"
	gets, puts := counted.gets.Load(), counted.puts.Load()
	interleave(b, []turn{
		{"plain", func() error {
			_, err := store.Put(ctx, plainKey, body, objectfence.Condition{})
			return err
		}},
		{"commit", func() error {
			var err error
			base, err = f.Commit(ctx, base, payload)
			return err
		}},
		{"read", func() error {
			_, err := reader.Read(ctx)
			return err
		}},
	})
	b.ReportMetric(float64(counted.gets.Load()-gets)/float64(b.N), "gets/commit")
	b.ReportMetric(float64(counted.puts.Load()-puts)/float64(b.N), "puts/commit")
}

// commitTally counts the outcomes of contended commits.
type commitTally struct {
	committed, stale, contended atomic.Int64
	highest                     atomic.Int64 // the highest token claimed
}

// claimed records a claim of token that landed.
func (t *commitTally) claimed(token int64) {
	for h := t.highest.Load(); token > h && !t.highest.CompareAndSwap(h, token); h = t.highest.Load() {
	}
}

func (t *commitTally) add(err error) error {
	var se *fence.StaleError
	switch {
	case err == nil:
		t.committed.Add(1)
	case errors.As(err, &se):
		t.stale.Add(1)
	case errors.Is(err, objectfence.ErrContended):
		t.contended.Add(1)
	default:
		return err
	}
	return nil
}

func manifestContended(b *testing.B, store objectfence.Store, key string, n int) {
	ctx := context.Background()
	f, counted, _, body := manifestFence(b, store, key, 1)
	var tokens atomic.Int64
	tokens.Store(1)
	var tally commitTally
	tally.claimed(1)
	commit := func() error {
		t := tokens.Add(1)
		batch, err := f.DataKey(t, "batch-000001.parquet")
		if err != nil {
			return err
		}
		base, err := f.Claim(ctx, t)
		if err == nil {
			tally.claimed(t)
			_, err = f.Commit(ctx, base, []byte(batch))
		}
		return tally.add(err)
	}
	plainKey := key + ".plain"
	plain := func() error {
		_, err := store.Put(ctx, plainKey, body, objectfence.Condition{})
		return err
	}
	raced := counted.raced.Load()
	round := 4 * n
	var fenced, unfenced time.Duration
	var ratios []float64 // fenced / plain, per round
	b.ResetTimer()
	for done, r := 0, 0; done < b.N; done, r = done+round, r+1 {
		k := min(round, b.N-done)
		var took [2]time.Duration // fenced, plain
		for i := range 2 {
			which := (i + r) % 2 // the fenced round first every other time
			d, err := concurrently(n, k, [2]func() error{commit, plain}[which])
			if err != nil {
				b.Fatal(err)
			}
			took[which] = d
		}
		fenced, unfenced = fenced+took[0], unfenced+took[1]
		ratios = append(ratios, float64(took[0])/float64(took[1]))
	}
	b.StopTimer()
	reportContended(b, f, &tally, counted.raced.Load()-raced, fenced, unfenced, ratios)
}

func reportContended(b *testing.B, f *objectfence.Fence, tally *commitTally, raced int64, fenced, unfenced time.Duration, ratios []float64) {
	m, err := f.Read(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if h := tally.highest.Load(); m.Token != h {
		b.Fatalf("the manifest holds token %d; the highest that claimed it is %d", m.Token, h)
	}
	per := func(n int64) float64 { return float64(n) / float64(b.N) }
	b.ReportMetric(float64(tally.committed.Load())/fenced.Seconds(), "commits/s")
	b.ReportMetric(float64(b.N)/unfenced.Seconds(), "plain-puts/s")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "commit/plain")
	b.ReportMetric(per(tally.stale.Load()), "stale/op")
	b.ReportMetric(per(raced), "retries/op")
	b.ReportMetric(per(tally.contended.Load()), "contended/op")
}

// concurrently runs op k times over n goroutines and returns how long
// that took, or op's first error.
func concurrently(n, k int, op func() error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(k) {
				if err := op(); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), first
}
