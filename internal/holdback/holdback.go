// Package holdback holds back a client's etcd traffic through its gRPC
// interceptors, for tests that need an order etcd allows but seldom shows:
// the client cannot tell that from a slow network or member.
//
// It is for holding back or losing chosen messages of one client (a watch
// response, a write's answer) in an order the test picks; for faults on a
// whole connection (pause, delay, blackhole) use etcdproc.Proxy, for
// round trips precise enough to measure internal/chaos/rttlab, and for
// partitions between hosts internal/chaos/netlab.
package holdback

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Client opens a client of endpoints whose calls go through
// unary and whose streams through stream, closed when the test ends.
func Client(t testing.TB, endpoints []string, unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(unary),
			grpc.WithChainStreamInterceptor(stream),
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// WatchHook sees the messages of a client's watch streams.
type WatchHook interface {
	// Send sees a request before it goes: blocking holds it back.
	Send(*pb.WatchRequest)
	// Recv sees a response as it comes, and tells whether to hold it
	// back until the release.
	Recv(*pb.WatchResponse) bool
}

// WatchStreams shows h the client's watch streams; the responses h holds
// back go once release is closed (nil: never).
func WatchStreams(h WatchHook, release <-chan struct{}) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || !strings.HasSuffix(method, "/Watch") {
			return cs, err
		}
		hs := &heldStream{ClientStream: cs, hook: h, release: release, in: make(chan recvd, 16)}
		go hs.pump()
		return hs, nil
	}
}

// recvd is one message from the underlying stream.
type recvd struct {
	wr  *pb.WatchResponse
	err error
}

// heldStream is a watch stream whose messages a hook sees and holds back.
type heldStream struct {
	grpc.ClientStream
	hook    WatchHook
	release <-chan struct{}
	in      chan recvd
	stash   []*pb.WatchResponse
	// heldIDs are the watches a response was held back of: their later
	// responses are held too, so that each watch's order is kept.
	heldIDs map[int64]bool
}

// pump reads the underlying stream, so that RecvMsg can wait for a
// message and for the release at once.
func (s *heldStream) pump() {
	for {
		wr := &pb.WatchResponse{}
		err := s.ClientStream.RecvMsg(wr)
		select {
		case s.in <- recvd{wr, err}:
		case <-s.Context().Done():
			return
		}
		if err != nil {
			return
		}
	}
}

func (s *heldStream) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok {
		s.hook.Send(req)
	}
	return s.ClientStream.SendMsg(m)
}

func (s *heldStream) RecvMsg(m any) error {
	for {
		var release <-chan struct{}
		if len(s.stash) > 0 {
			if Closed(s.release) {
				// Held responses go before any read since: each watch's
				// order is kept.
				deliver(m, s.stash[0])
				s.stash = s.stash[1:]
				return nil
			}
			release = s.release
		}
		select {
		case <-release: // delivered above
		case <-s.Context().Done():
			return s.Context().Err()
		case r := <-s.in:
			if r.err != nil {
				return r.err
			}
			if !s.holds(r.wr) {
				deliver(m, r.wr)
				return nil
			}
		}
	}
}

// holds shows wr to the hook, and stashes it if the hook picks it before
// the release or its watch has a response held back; it reports whether
// it did.
func (s *heldStream) holds(wr *pb.WatchResponse) bool {
	pick := s.hook.Recv(wr)
	if !s.heldIDs[wr.WatchId] && (!pick || Closed(s.release)) {
		return false
	}
	if s.heldIDs == nil {
		s.heldIDs = map[int64]bool{}
	}
	s.heldIDs[wr.WatchId] = true
	s.stash = append(s.stash, wr)
	return true
}

// Closed tells whether ch is closed, without waiting.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// deliver copies wr into m, the caller's *pb.WatchResponse. The message is
// a protobuf of Google's runtime from etcd's client v3.7 on and of gogo's
// before; copying the struct works for both, and wr is not used again.
func deliver(m any, wr *pb.WatchResponse) {
	reflect.ValueOf(m).Elem().Set(reflect.ValueOf(wr).Elem())
}
