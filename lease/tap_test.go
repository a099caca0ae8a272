package lease_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/leasefence/leasefence/internal/holdback"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// tap is a client's view of its own gRPC traffic, for tests that have to
// order what two watches deliver: it records which watches were created
// and which reads were sent after, and holds back the watch responses a
// predicate picks until the test releases them. Two watches' events reach
// a lock in no fixed order (the client hands each watch's responses to
// its own goroutine), so holding one back is an order etcd allows.
type tap struct {
	mu      sync.Mutex
	pending []string        // keys of watch creations sent, not yet answered
	created map[string]bool // keys whose watch etcd created
	// txns counts the Txn calls answered, each with the watches created
	// as it was sent.
	txns []map[string]bool
	// hold picks the responses to hold back; nil holds none.
	hold     func(*pb.WatchResponse) bool
	released chan struct{} // closed by release
	moved    chan struct{} // closed, and replaced, as anything above changes
}

func newTap() *tap {
	return &tap{created: map[string]bool{}, released: make(chan struct{}), moved: make(chan struct{})}
}

// tapClient is a client of the package's etcd whose traffic tp sees.
func tapClient(t *testing.T, tp *tap) *clientv3.Client {
	t.Helper()
	return holdback.Client(t, etcd.Endpoints(), tp.unary, holdback.WatchStreams(tp, tp.released))
}

// changed wakes awaiters. tp.mu is held.
func (tp *tap) changed() {
	close(tp.moved)
	tp.moved = make(chan struct{})
}

// await waits until cond holds, looking again whenever the tap moves.
func (tp *tap) await(ctx context.Context, t *testing.T, what string, cond func(*tap) bool) {
	t.Helper()
	for {
		tp.mu.Lock()
		ok, moved := cond(tp), tp.moved
		tp.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-moved:
		case <-ctx.Done():
			t.Fatalf("tap: never saw %s", what)
		}
	}
}

// readAfter tells whether a Txn sent once every key of keys had its
// watch created has been answered. tp.mu is held.
func (tp *tap) readAfter(keys ...string) bool {
	for _, seen := range tp.txns {
		all := true
		for _, k := range keys {
			all = all && seen[k]
		}
		if all {
			return true
		}
	}
	return false
}

// release lets the held responses through.
func (tp *tap) release() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if !holdback.Closed(tp.released) {
		close(tp.released)
	}
}

func (tp *tap) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	tp.mu.Lock()
	seen := make(map[string]bool, len(tp.created))
	for k := range tp.created {
		seen[k] = true
	}
	tp.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && strings.HasSuffix(method, "/Txn") {
		tp.mu.Lock()
		tp.txns = append(tp.txns, seen)
		tp.changed()
		tp.mu.Unlock()
	}
	return err
}

// send records the key of a watch asked for.
func (tp *tap) Send(req *pb.WatchRequest) {
	if cr := req.GetCreateRequest(); cr != nil {
		tp.mu.Lock()
		tp.pending = append(tp.pending, string(cr.Key))
		tp.mu.Unlock()
	}
}

// recv records a created watch, and picks the responses tp.hold picks.
func (tp *tap) Recv(wr *pb.WatchResponse) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if wr.Created && len(tp.pending) > 0 {
		tp.created[tp.pending[0]] = true
		tp.pending = tp.pending[1:]
		tp.changed()
	}
	return tp.hold != nil && tp.hold(wr)
}
