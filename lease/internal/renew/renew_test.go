package renew

import (
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	r := &Renewer{clock: realClock{}, sessions: make(map[clientv3.LeaseID]*keptSession)}
	add := func(id clientv3.LeaseID, until time.Duration) *fakeSession {
		s := &fakeSession{id: id, ttl: 2 * time.Second, deadline: time.Now().Add(until)}
		r.sessions[id] = &keptSession{s: s}
		return s
	}
	near, far := add(1, 150*time.Millisecond), add(2, 600*time.Millisecond)
	r.lag.observe(time.Now(), 200*time.Millisecond)
	r.aimFromLag(time.Now())
	r.tick(nil, time.Now())
	if !near.Ended() {
		t.Error("a session 150 ms from its deadline lives on with a lag of 200 ms")
	}
	if far.Ended() {
		t.Errorf("a session 600 ms from its deadline ended with a lag of 200 ms: %s", far.lost)
	}
	r.lag.observe(time.Now(), 10*time.Second)
	r.aimFromLag(time.Now())
	r.tick(nil, time.Now())
	if far.Ended() {
		t.Errorf("a session 600 ms from its deadline ended: the lag is capped at a quarter of the 2 s TTL: %s", far.lost)
	}
}

// A session's second lease goes out in the same send as its own, and
// its answer is no answer for the session.
func TestTickRenewsAlsoWithLease(t *testing.T) {
	r := &Renewer{clock: realClock{}, sessions: make(map[clientv3.LeaseID]*keptSession)}
	s := &fakeSession{id: 1, ttl: 3 * time.Second, deadline: time.Now().Add(3 * time.Second), also: 7}
	plain := &fakeSession{id: 2, ttl: 3 * time.Second, deadline: time.Now().Add(3 * time.Second)}
	r.sessions[1], r.sessions[2] = &keptSession{s: s}, &keptSession{s: plain}
	r.tick(make(chan struct{}, 1), time.Now())
	// The second lease goes just before its session's: on one stream a
	// renewal of the session's lease then means the second was renewed.
	at := slices.Index(r.outbox, 7)
	if at < 0 || at+1 >= len(r.outbox) || r.outbox[at+1] != 1 || !slices.Contains(r.outbox, 2) || len(r.outbox) != 3 {
		t.Fatalf("outbox %v, want 7 just before 1, and 2", r.outbox)
	}
	r.answer(&pb.LeaseKeepAliveResponse{ID: 7, TTL: -1})
	if s.Ended() || len(r.sessions[1].sent) != 1 {
		t.Fatalf("an answer for the second lease was taken as the session's: ended %v, sent %d", s.Ended(), len(r.sessions[1].sent))
	}
}

// realClock is package lease's release clock.
type realClock struct{}

func (realClock) Now() time.Time                      { return time.Now() }
func (realClock) Real(d time.Duration) time.Duration  { return d }
func (realClock) Scale(d time.Duration) time.Duration { return d }

// fakeSession is a session that a test's calls to tick alone touch.
type fakeSession struct {
	id       clientv3.LeaseID
	ttl      time.Duration
	deadline time.Time
	lost     string // why Lose ended it; empty while it lives
	also     clientv3.LeaseID
}

func (s *fakeSession) Lease() clientv3.LeaseID { return s.id }
func (s *fakeSession) TTL() time.Duration      { return s.ttl }
func (s *fakeSession) Deadline() time.Time     { return s.deadline }
func (s *fakeSession) Ended() bool             { return s.lost != "" }
func (s *fakeSession) Lose(reason string)      { s.lost = reason }
func (s *fakeSession) Also() clientv3.LeaseID  { return s.also }

func (s *fakeSession) Renewed(time.Time, int64, int64) {}
