package lease_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// createdCount counts the watch creations a client's streams have had
// answered (etcd's Created responses).
type createdCount struct{ n atomic.Int64 }

func (c *createdCount) interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return createdStream{s, c}, nil
}

type createdStream struct {
	grpc.ClientStream
	c *createdCount
}

func (s createdStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*pb.WatchResponse); err == nil && ok && r.Created {
		s.c.n.Add(1)
	}
	return err
}

// A far waiter X (five keys ahead) is the first lock of its name on its
// session that needs the queue watch: when a key it follows goes, it
// starts that watch (rereadFar -> queueUp -> queueWatch) and stores it in
// the gate's watches. If X's own key is deleted at the same revision, the
// own-key watch's goroutine ends X and hands the gate to the next lock Y
// of the name on the same session, while X's take goroutine may still be
// starting the queue watch. Found by a cold review, with -race, in about
// one round in a few hundred: the gate's queue watch is now set once,
// atomically (watches.setQueue). Every round also checks that X ends and Y
// is granted once the keys ahead go; each is bounded.
func TestQueueWatchStartAsLockEnds(t *testing.T) {
	etcdproc.LeakCheck(t)
	admin, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	ctx := etcdproc.Ctx(t, 5*time.Minute)

	rounds, ahead := 300, 5
	if testing.Short() {
		rounds = 30
	}
	for r := 0; r < rounds; r++ {
		name := etcdproc.Name(t, fmt.Sprintf("qstart%d", r))
		// Keys ahead, each on a lease of its own, laid out as etcd's
		// Mutex lays them out.
		var leases []clientv3.LeaseID
		var keys []string
		for i := 0; i < ahead; i++ {
			g, err := admin.Grant(ctx, 30)
			if err != nil {
				t.Fatal(err)
			}
			k := fmt.Sprintf("%s/%x", name, int64(g.ID))
			if _, err := admin.Put(ctx, k, "", clientv3.WithLease(g.ID)); err != nil {
				t.Fatal(err)
			}
			leases, keys = append(leases, g.ID), append(keys, k)
		}
		created := &createdCount{}
		cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(created.interceptor)}})
		if err != nil {
			t.Fatal(err)
		}
		s, err := lease.NewSession(ctx, cli)
		if err != nil {
			t.Fatal(err)
		}
		x := lockAsync(ctx, s, name)
		waitQueued(t, admin, name, ahead+1)
		y := lockAsync(ctx, s, name) // waits for the name's gate on s
		// The own-key watch and the two follow watches are up.
		for created.n.Load() < 3 {
			select {
			case res := <-x:
				t.Fatalf("round %d: X returned early: %v", r, res.err)
			case <-time.After(time.Millisecond):
			}
		}
		// The newest key ahead (followed) and X's own key go at once.
		if _, err := admin.Txn(ctx).Then(clientv3.OpDelete(keys[ahead-1]), clientv3.OpDelete(keyOf(name, s))).Commit(); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-x:
			if res.err == nil {
				t.Fatalf("round %d: X granted after its key was deleted", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: X not ended 10s after its key was deleted", r)
		}
		for _, id := range leases {
			if _, err := admin.Revoke(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case res := <-y:
			if res.err != nil {
				t.Fatalf("round %d: Y: %v", r, res.err)
			}
			if err := res.l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Y not granted 10s after every key ahead went", r)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		cli.Close()
	}
}
