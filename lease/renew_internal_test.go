package lease

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A lateness counts for one to two windows, then is forgotten; the largest
// in the two windows is the lag.
func TestLagMeterWindows(t *testing.T) {
	var m lagMeter
	t0 := time.Now()
	if got := m.get(t0); got != 0 {
		t.Fatalf("new meter: lag %v, want 0", got)
	}
	m.observe(t0, 30*time.Millisecond)
	m.observe(t0.Add(time.Second), 10*time.Millisecond)
	if got := m.get(t0.Add(2 * time.Second)); got != 30*time.Millisecond {
		t.Fatalf("same window: lag %v, want 30ms", got)
	}
	m.observe(t0.Add(lagWindow+time.Second), 20*time.Millisecond)
	if got := m.get(t0.Add(lagWindow + 2*time.Second)); got != 30*time.Millisecond {
		t.Fatalf("next window: lag %v, want the last window's 30ms", got)
	}
	if got := m.get(t0.Add(2*lagWindow + time.Second)); got != 20*time.Millisecond {
		t.Fatalf("two windows on: lag %v, want the last window's 20ms", got)
	}
	if got := m.get(t0.Add(5 * lagWindow)); got != 0 {
		t.Fatalf("long after: lag %v, want 0", got)
	}
}

// A renewer ends a session its lag before the deadline, never more than
// a quarter of the TTL before it.
func TestTickAimsEarlyByLag(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &renewer{sessions: make(map[clientv3.LeaseID]*keptSession)}
	add := func(id clientv3.LeaseID, until time.Duration) *Session {
		s := &Session{id: id, ttl: 2 * time.Second, deadline: time.Now().Add(until), lg: zap.NewNop()}
		s.ctx, s.cancel = context.WithCancelCause(ctx)
		r.sessions[id] = &keptSession{s: s}
		return s
	}
	near, far := add(1, 150*time.Millisecond), add(2, 600*time.Millisecond)
	r.lag.observe(time.Now(), 200*time.Millisecond)
	r.aimFromLag(time.Now())
	r.tick(nil, time.Now())
	if near.Err() == nil {
		t.Error("a session 150 ms from its deadline lives on with a lag of 200 ms")
	}
	if far.Err() != nil {
		t.Errorf("a session 600 ms from its deadline ended with a lag of 200 ms: %v", far.Err())
	}
	r.lag.observe(time.Now(), 10*time.Second)
	r.aimFromLag(time.Now())
	r.tick(nil, time.Now())
	if far.Err() != nil {
		t.Errorf("a session 600 ms from its deadline ended: the lag is capped at a quarter of the 2 s TTL: %v", far.Err())
	}
}
