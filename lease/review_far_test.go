package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/etcdproc"
)

// rawQueueKey puts name/<hex lease> on a fresh lease, as etcd's own lock
// code (concurrency.Mutex, etcdctl lock) does: a queue key with no
// leasefence lock behind it.
func rawQueueKey(t *testing.T, cli *clientv3.Client, name string) string {
	t.Helper()
	g, err := cli.Grant(etcdproc.Ctx(t, 30*time.Second), 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Revoke(context.Background(), g.ID) })
	key := fmt.Sprintf("%s/%x", name, int64(g.ID))
	if _, err := cli.Put(etcdproc.Ctx(t, 30*time.Second), key, "", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Delete(context.Background(), key) })
	return key
}

// A far waiter (H, K1, K2, K3 ahead) follows K3 and K2. K1, which it does
// not follow, is moved off its lease: it is no lock any more. K2 goes;
// rereadFar's keys-only read shows H, K1, K3 with the creation revisions
// the waiter knows, so relist lists K1 as the blocking key it was; three
// ahead makes the waiter near, on the queue watch, which came up after
// K1's put. H and K3 go: the waiter's turn has come.
func TestFarTurnedNearBehindKeyMovedOffLease(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "far-near-moved")
	var ks []string
	for range 4 { // H, K1, K2, K3
		ks = append(ks, rawQueueKey(t, cli, name))
	}
	h, k1, k2, k3 := ks[0], ks[1], ks[2], ks[3]
	tp := newTap()
	ws := newSession(t, tapClient(t, tp))
	ctx, cancel := context.WithCancel(etcdproc.Ctx(t, 30*time.Second))
	defer cancel()
	wch := lockAsync(ctx, ws, name)
	waitQueued(t, cli, name, 5)
	tp.await(etcdproc.Ctx(t, 30*time.Second), t, "the waiter following K3 and K2", func(tp *tap) bool { return tp.readAfter(k3, k2) })

	moveOffLease(t, cli, k1)
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), k2); err != nil {
		t.Fatal(err)
	}
	expectPending(t, wch, 200*time.Millisecond) // H holds
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), h); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(etcdproc.Ctx(t, 30*time.Second), k3); err != nil {
		t.Fatal(err)
	}
	// Only K1 is left ahead, and it is no lock.
	l := grantWithin(t, wch, 5*time.Second, "the waiter behind only a key moved off its lease")
	if err := l.Unlock(etcdproc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
}
