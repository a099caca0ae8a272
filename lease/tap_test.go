package lease_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
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
	held     chan struct{} // closed once a response was held back
	released chan struct{} // closed by release
	moved    chan struct{} // closed, and replaced, as anything above changes
}

func newTap() *tap {
	return &tap{created: map[string]bool{}, held: make(chan struct{}), released: make(chan struct{}), moved: make(chan struct{})}
}

// tapClient is a client of the package's etcd whose traffic tp sees.
func tapClient(t *testing.T, tp *tap) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   etcd.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainStreamInterceptor(tp.stream),
			grpc.WithChainUnaryInterceptor(tp.unary),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
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
	select {
	case <-tp.released:
	default:
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

func (tp *tap) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || !strings.HasSuffix(method, "/Watch") {
		return cs, err
	}
	ts := &tapStream{ClientStream: cs, tp: tp, in: make(chan recvd, 16)}
	go ts.pump()
	return ts, nil
}

// recvd is one message from the underlying stream.
type recvd struct {
	wr  *pb.WatchResponse
	err error
}

// tapStream is a watch stream seen through a tap.
type tapStream struct {
	grpc.ClientStream
	tp    *tap
	in    chan recvd
	stash []*pb.WatchResponse
	// heldIDs are the watches a response was held back of: their later
	// responses are held too, so that each watch's order is kept.
	heldIDs map[int64]bool
}

// pump reads the underlying stream, so that RecvMsg can wait for a
// message and for a release at once.
func (ts *tapStream) pump() {
	for {
		wr := &pb.WatchResponse{}
		err := ts.ClientStream.RecvMsg(wr)
		select {
		case ts.in <- recvd{wr, err}:
		case <-ts.ClientStream.Context().Done():
			return
		}
		if err != nil {
			return
		}
	}
}

func (ts *tapStream) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok {
		if cr := req.GetCreateRequest(); cr != nil {
			ts.tp.mu.Lock()
			ts.tp.pending = append(ts.tp.pending, string(cr.Key))
			ts.tp.mu.Unlock()
		}
	}
	return ts.ClientStream.SendMsg(m)
}

func (ts *tapStream) RecvMsg(m any) error {
	for {
		var released <-chan struct{}
		if len(ts.stash) > 0 {
			released = ts.tp.released
			select {
			case <-released:
				// Held responses first: a watch's order is kept.
				proto.Merge(m.(proto.Message), ts.stash[0])
				ts.stash = ts.stash[1:]
				return nil
			default:
			}
		}
		select {
		case <-released:
			proto.Merge(m.(proto.Message), ts.stash[0])
			ts.stash = ts.stash[1:]
			return nil
		case <-ts.ClientStream.Context().Done():
			return ts.ClientStream.Context().Err()
		case r := <-ts.in:
			if r.err != nil {
				return r.err
			}
			if ts.take(r.wr) {
				continue
			}
			proto.Merge(m.(proto.Message), r.wr)
			return nil
		}
	}
}

// take records a created watch, and holds back a response the tap's
// predicate picks (while not released); it reports whether it held it.
func (ts *tapStream) take(wr *pb.WatchResponse) bool {
	tp := ts.tp
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if wr.Created && len(tp.pending) > 0 {
		tp.created[tp.pending[0]] = true
		tp.pending = tp.pending[1:]
		tp.changed()
	}
	select {
	case <-tp.released:
		return false
	default:
	}
	if !ts.heldIDs[wr.WatchId] && (tp.hold == nil || !tp.hold(wr)) {
		return false
	}
	if ts.heldIDs == nil {
		ts.heldIDs = map[int64]bool{}
	}
	ts.heldIDs[wr.WatchId] = true
	ts.stash = append(ts.stash, wr)
	select {
	case <-tp.held:
	default:
		close(tp.held)
	}
	tp.changed()
	return true
}
