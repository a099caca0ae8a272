package lease_test

import (
	"context"
	"strings"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// streamCount counts the messages on a client's streams that match: those
// it sends, by sent, and those it receives, by received (either may be
// nil).
type streamCount struct {
	sent, received func(m any) bool
	n              atomic.Int64
}

// watchCreatesUnder counts the watches a client asks etcd to create on
// keys under prefix.
func watchCreatesUnder(prefix string) *streamCount {
	return &streamCount{sent: func(m any) bool {
		w, ok := m.(*pb.WatchRequest)
		cr := w.GetCreateRequest()
		return ok && cr != nil && strings.HasPrefix(string(cr.Key), prefix)
	}}
}

// keyWatchCreatesUnder counts the watches a client asks etcd to create on
// single keys under prefix: the watches of keys ahead, not of the queue.
func keyWatchCreatesUnder(prefix string) *streamCount {
	return &streamCount{sent: func(m any) bool {
		w, ok := m.(*pb.WatchRequest)
		cr := w.GetCreateRequest()
		return ok && cr != nil && len(cr.RangeEnd) == 0 && strings.HasPrefix(string(cr.Key), prefix)
	}}
}

// watchEventsUnder counts the watch responses a client receives that
// carry events of keys under prefix.
func watchEventsUnder(prefix string) *streamCount {
	return &streamCount{received: func(m any) bool {
		w, ok := m.(*pb.WatchResponse)
		return ok && len(w.Events) > 0 && strings.HasPrefix(string(w.Events[0].Kv.Key), prefix)
	}}
}

func (c *streamCount) interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return countingStream{s, c}, nil
}

type countingStream struct {
	grpc.ClientStream
	c *streamCount
}

func (s countingStream) SendMsg(m any) error {
	if s.c.sent != nil && s.c.sent(m) {
		s.c.n.Add(1)
	}
	return s.ClientStream.SendMsg(m)
}

func (s countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.c.received != nil && s.c.received(m) {
		s.c.n.Add(1)
	}
	return err
}
