package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

func TestInspectQueue(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "inspect")
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), name+"/checkpoint", "data"); err != nil { // not an entry
		t.Fatal(err)
	}
	holder := mustLock(t, newSession(t, cli, lease.WithTTL(5*time.Second)), name)
	mustLock(t, newSession(t, cli), name+"/nested") // another lock's key: not an entry
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	var waiters []*lease.Session
	done := make(chan error, 2)
	for i := 0; i < 2; i++ {
		s := newSession(t, cli)
		waiters = append(waiters, s)
		go func() {
			_, err := s.Campaign(ctx, name, "candidate")
			done <- err
		}()
		waitEntries(t, cli, name, i+2)
	}
	entries, err := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Fatalf("entries %+v, want the holder and 2 waiters", entries)
	}
	if e := entries[0]; e.Key != holder.Key() || e.Token != holder.Token() || e.TTL <= 0 || e.TTL > 5*time.Second || e.Value != "" {
		t.Fatalf("holder entry %+v, want %s token %d with a TTL up to 5s", e, holder.Key(), holder.Token())
	}
	for i, e := range entries[1:] {
		if e.Lease != waiters[i].Lease() || e.Value != "candidate" || e.Token <= entries[i].Token || e.TTL <= 0 {
			t.Fatalf("waiter %d: %+v, want lease %x in order", i, e, int64(waiters[i].Lease()))
		}
	}
	cancel()
	for range waiters {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter: %v", err)
		}
	}
	if _, err := lease.Inspect(etcdproc.Ctx(t, 30*time.Second), cli, "bad/"); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("Inspect of a bad name: %v", err)
	}
}

// waitEntries waits until Inspect finds n entries under name, looking
// again at each change under the name.
func waitEntries(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	wch := cli.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	for {
		entries, err := lease.Inspect(ctx, cli, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) >= n {
			return
		}
		select {
		case <-wch:
		case <-ctx.Done():
			t.Fatalf("%d entries never queued under %s", n, name)
		}
	}
}
