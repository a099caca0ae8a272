package inprocess_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/internal/etcdtest"
	"github.com/leasefence/leasefence/internal/holdback"
	"github.com/leasefence/leasefence/lease"
)

// laggingRounds is how many times the window is driven. Each round makes
// it on purpose, so one would do; more rounds catch a fix that only
// narrows it (the review's race was caught in 2 of 5 runs).
const laggingRounds = 6

// A waiter whose reads are answered by a lagging member is granted once
// the lock is free (issue 27, bug 2). The holder lets go after the
// waiter's put but before the waiter's queue watch comes up, so the watch
// starts past the deletion and never reports it. If the waiter then reads
// its queue from a member that has applied its put but not that deletion,
// and takes the answer, its view keeps a holder that is gone, and nothing
// will ever take it out: the waiter hangs while the lock is free. The read
// must be no older than the revision the queue watch came up at; refused
// by the lagging member, it is made again linearizably, which that member
// answers once it goes on, and the waiter is granted then.
//
// Three members. The waiter's client writes and watches through one
// member and sends every read to another, which a test-held apply keeps
// lagging (etcdtest.HoldApply): a client that balances reads across
// members, at its worst. The test holds back the request that opens the
// waiter's queue watch, and meanwhile makes the lagging member stop after
// it has applied the waiter's put, and has the holder let go.
func TestWaiterNotStrandedByLaggingMember(t *testing.T) {
	etcdtest.LeakCheckStoppedMembers(t)
	c := etcdtest.StartT(t, etcdtest.Config{Members: 3})
	serving, lagging := servingAndLagging(t, c)
	for round := range laggingRounds {
		t.Run(fmt.Sprint(round), func(t *testing.T) { laggingRound(t, serving, lagging) })
	}
}

// servingAndLagging picks the leader to serve the clients' writes and
// watches, and a follower to lag.
func servingAndLagging(t *testing.T, c *etcdtest.Cluster) (serving, lagging *etcdtest.Member) {
	t.Helper()
	// A linearizable read needs a leader: once it is answered, the
	// members know which one leads.
	if _, err := c.ClientT(t).Get(etcdproc.Ctx(t, 30*time.Second), "leasefence-leader"); err != nil {
		t.Fatal(err)
	}
	serving = c.Leader()
	if serving == nil {
		t.Fatal("no member says it leads")
	}
	for _, m := range c.Members {
		if m != serving {
			lagging = m
		}
	}
	return serving, lagging
}

// laggingRound drives the window once: holder H holds, W queues, the
// lagging member stops once it has applied W's put, H lets go, W's queue
// watch comes up and W reads its queue from the lagging member; W must be
// granted within grantBound of the member going on.
func laggingRound(t *testing.T, serving, lagging *etcdtest.Member) {
	const grantBound = 5 * time.Second
	ctx := etcdproc.Ctx(t, 30*time.Second)
	name := etcdproc.Name(t, "lagging")
	onServing := memberClient(t, serving)
	onLagging := memberClient(t, lagging)
	// The waiter's Lock call, and the gate that holds it, end with wctx.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reads := &laggingReads{to: onLagging, prefix: name + "/", queueReads: make(chan int64, 16)}
	gate := &queueWatchGate{prefix: name + "/", asked: make(chan struct{}), open: make(chan struct{}), ctx: wctx}
	// W's client: its reads go to the lagging member, its queue watch
	// waits for gate.
	wcli := holdback.Client(t, []string{serving.ClientURL}, reads.route, holdback.WatchStreams(gate, nil))

	h := mustLock(t, newSession(t, onServing), name)
	w := newSession(t, wcli)
	wch := lockAsync(wctx, w, name)
	returned := false
	defer func() {
		if !returned { // a failed round: its Lock call must not outlive it
			cancel()
			<-wch
		}
	}()

	// W has put its key and is about to open its queue watch.
	awaitClosed(t, gate.asked, "the waiter never asked for its queue watch, which this test holds back to make the window")
	token := appliedOn(t, onLagging, fmt.Sprintf("%s/%x", name, int64(w.Lease())))
	release, err := lagging.HoldApply()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release) // on every path, before the cluster stops
	deletedAt := deletion(ctx, onServing, h)
	mustUnlock(t, h)
	deleteRev := awaitRev(t, deletedAt, "the holder's deletion")
	laggingRev := stillHeld(t, onLagging, h, deleteRev)

	// The queue watch comes up past the deletion; W reads its queue from
	// the lagging member.
	close(gate.open)
	var staleRev int64
	select {
	case staleRev = <-reads.queueReads:
	case r := <-wch:
		returned = true
		t.Fatalf("the waiter returned (err %v) without reading its queue from the lagging member: the window was not made", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never read its queue from the lagging member: the window was not made")
	}
	if staleRev >= deleteRev {
		t.Fatalf("the lagging member answered at revision %d, not below the deletion at %d: the window was not made", staleRev, deleteRev)
	}
	release()
	thawed := time.Now()
	revs := fmt.Sprintf("token %d, lagging member stopped at %d, holder deleted at %d, queue watch up at %d, queue read at %d",
		token, laggingRev, deleteRev, gate.upRev.Load(), staleRev)
	select {
	case r := <-wch:
		returned = true
		if r.err != nil {
			t.Fatalf("waiter: %v (%s)", r.err, revs)
		}
		if r.l.Token() <= h.Token() {
			t.Errorf("waiter's token %d not above the holder's %d", r.l.Token(), h.Token())
		}
		t.Logf("granted %v after the lagging member went on; %s", time.Since(thawed).Round(time.Millisecond), revs)
		mustUnlock(t, r.l)
	case <-time.After(grantBound):
		t.Errorf("waiter not granted %v after the lagging member went on, with the lock free: %s", grantBound, revs)
	}
}

// memberClient opens a client of one member, closed when the test ends.
func memberClient(t *testing.T, m *etcdtest.Member) *clientv3.Client {
	t.Helper()
	cli, err := etcdproc.NewClient([]string{m.ClientURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// appliedOn waits until the member cli talks to has applied the put of
// key, and returns the key's creation revision: the member may answer
// the waiter's reads from then on.
func appliedOn(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	ctx := etcdproc.Ctx(t, 30*time.Second)
	resp, err := cli.Get(ctx, key, clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 1 {
		return resp.Kvs[0].CreateRevision
	}
	// Not yet: its watch from the revision after the read reports the
	// put once the member has applied it.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				return ev.Kv.CreateRevision
			}
		}
	}
	t.Fatalf("%s never applied on the member", key)
	return 0
}

// deletion watches the holder's key and sends the revision it is
// deleted at.
func deletion(ctx context.Context, cli *clientv3.Client, h *lease.Lock) <-chan int64 {
	ch := make(chan int64, 1)
	wctx, cancel := context.WithCancel(ctx)
	wch := cli.Watch(wctx, h.Key(), clientv3.WithRev(h.Token()+1), clientv3.WithFilterPut())
	go func() {
		defer cancel()
		for wr := range wch {
			if len(wr.Events) > 0 {
				ch <- wr.Events[0].Kv.ModRevision
				return
			}
		}
	}()
	return ch
}

// stillHeld checks that the lagging member still shows the holder's key,
// deleted at deleteRev, and returns the revision it stopped at.
func stillHeld(t *testing.T, onLagging *clientv3.Client, h *lease.Lock, deleteRev int64) int64 {
	t.Helper()
	resp, err := onLagging.Get(etcdproc.Ctx(t, 30*time.Second), h.Key(), clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Header.Revision >= deleteRev {
		t.Fatalf("the lagging member at revision %d (keys %v) has applied the deletion at %d: no window", resp.Header.Revision, resp.Kvs, deleteRev)
	}
	return resp.Header.Revision
}

func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

func awaitRev(t *testing.T, ch <-chan int64, what string) int64 {
	t.Helper()
	select {
	case rev := <-ch:
		return rev
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not seen", what)
		return 0
	}
}

// laggingReads sends a client's reads to another client's member (to),
// and everything else (writes, lease requests, watches) to its own: a
// client that balances reads, all of whose reads land on the member that
// lags. The revisions the reads of the queue under prefix were answered
// at go to queueReads.
type laggingReads struct {
	to         *clientv3.Client
	prefix     string
	queueReads chan int64
}

func (r *laggingReads) route(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var readOnly, ofQueue bool
	switch q := req.(type) {
	case *pb.RangeRequest:
		readOnly, ofQueue = true, string(q.Key) == r.prefix
	case *pb.TxnRequest:
		readOnly, ofQueue = txnReads(q, r.prefix)
	}
	if !readOnly {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	err := r.to.ActiveConnection().Invoke(ctx, method, req, reply, opts...)
	if h, ok := reply.(interface{ GetHeader() *pb.ResponseHeader }); ok && err == nil && ofQueue {
		select {
		case r.queueReads <- h.GetHeader().GetRevision():
		default:
		}
	}
	return err
}

// txnReads tells whether t only reads, and whether it reads the keys
// under prefix.
func txnReads(t *pb.TxnRequest, prefix string) (readOnly, ofQueue bool) {
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		for _, op := range ops {
			rr := op.GetRequestRange()
			if rr == nil {
				return false, false
			}
			ofQueue = ofQueue || string(rr.Key) == prefix
		}
	}
	return true, ofQueue
}

// queueWatchGate holds back a client's first request to watch the keys
// under prefix, and closes asked when it comes, until open is closed or
// ctx ends. upRev is the revision that watch came up at.
type queueWatchGate struct {
	prefix      string
	asked, open chan struct{}
	ctx         context.Context
	sent        atomic.Bool
	upRev       atomic.Int64
}

// send holds back the first request to watch the queue.
func (g *queueWatchGate) Send(req *pb.WatchRequest) {
	cr := req.GetCreateRequest()
	if cr == nil || string(cr.Key) != g.prefix || len(cr.RangeEnd) == 0 || g.sent.Swap(true) {
		return
	}
	close(g.asked)
	select {
	case <-g.open:
	case <-g.ctx.Done():
	}
}

// recv records the revision the queue watch came up at, and holds back
// no response.
func (g *queueWatchGate) Recv(wr *pb.WatchResponse) bool {
	// The client asks for one watch at a time, each once the one before
	// is up: the first to come up after the queue's was asked for is it.
	if wr.Created && g.sent.Load() {
		g.upRev.CompareAndSwap(0, wr.Header.Revision)
	}
	return false
}
