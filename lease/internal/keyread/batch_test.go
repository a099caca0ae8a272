package keyread

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// Once every read queued is answered, the batcher keeps none of them:
// after a burst, the answers (and what they hold: a held lock's closure,
// say) are free to be collected, though later reads go on.
func TestBatcherKeepsNoAnsweredRead(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcdproc.New(t)
	ctx := etcdproc.Ctx(t, 30*time.Second)
	var wg sync.WaitGroup
	defer wg.Wait()
	b := &Batcher{Client: cli, Max: 16, MaxInFlight: 1, Ctx: ctx, Timeout: 5 * time.Second,
		Go: func(f func()) error { wg.Go(f); return nil }}
	prefix := etcdproc.Name(t, "batch")
	if _, err := cli.Put(ctx, prefix+"/0", "v"); err != nil {
		t.Fatal(err)
	}

	// A burst: more reads than one batch, so that they queue.
	const n = 200
	type payload struct{ _ [64]byte }
	gone := make([]weak.Pointer[payload], n)
	var answered sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		p := &payload{}
		gone[i] = weak.Make(p)
		answered.Add(1)
		b.Read(fmt.Sprintf("%s/%d", prefix, i%3), 0, func(kv *mvccpb.KeyValue, rev int64, err error) {
			defer answered.Done()
			runtime.KeepAlive(p)
			if err != nil {
				errs <- err
			}
		})
	}
	answered.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.GC()
	kept := 0
	for _, w := range gone {
		if w.Value() != nil {
			kept++
		}
	}
	if kept > 0 {
		t.Fatalf("%d of %d answered reads are still kept", kept, n)
	}

	// And the batcher still works after its queue emptied.
	done := make(chan error, 1)
	b.Read(prefix+"/0", 0, func(kv *mvccpb.KeyValue, rev int64, err error) {
		if err == nil && kv == nil {
			err = fmt.Errorf("%s/0 read as absent", prefix)
		}
		done <- err
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
