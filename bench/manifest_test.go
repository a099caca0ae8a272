package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

// puts counts the conditional puts a Fence sends: attempts per commit.
type puts struct {
	objectfence.Store
	n atomic.Int64
}

func (p *puts) Put(ctx context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	p.n.Add(1)
	return p.Store.Put(ctx, key, body, cond)
}

func manifestFence(b *testing.B) (*objectfence.Fence, *puts) {
	b.Helper()
	srv, bucket := s3test.StartVersityT(b)
	store, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		b.Fatal(err)
	}
	p := &puts{Store: store}
	f, err := objectfence.New(p, "manifest")
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Check(context.Background()); err != nil {
		b.Fatal(err)
	}
	return f, p
}

// BenchmarkManifest compares a fenced manifest commit (a read and a
// conditional put) with a plain unconditional put of the same object on
// the same versitygw gateway, in turns (interleave; commit/plain is the
// ratio). The contended rows are one holder's committers at once, all with
// the same token, so that every commit ends written: they report commits
// per second and conditional puts per commit (1 means no retry).
func BenchmarkManifest(b *testing.B) {
	b.Run("uncontended", func(b *testing.B) {
		f, p := manifestFence(b)
		ctx := context.Background()
		body := []byte(`{"token":7,"payload":"YmF0Y2g="}`)
		interleave(b, []turn{
			{"plain", func() error {
				_, err := p.Store.Put(ctx, "plain-manifest", body, objectfence.Condition{})
				return err
			}},
			{"commit", func() error {
				_, err := f.Commit(ctx, 7, []byte("batch"))
				return err
			}},
		})
	})
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("committers=%d", n), func(b *testing.B) {
			f, p := manifestFence(b)
			contendedCommits(b, f, p, n)
		})
	}
}

func contendedCommits(b *testing.B, f *objectfence.Fence, p *puts, n int) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	p.n.Store(0)
	b.ResetTimer()
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if _, err := f.Commit(ctx, 7, []byte("batch")); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
	b.ReportMetric(float64(p.n.Load())/float64(b.N), "puts/commit")
}
