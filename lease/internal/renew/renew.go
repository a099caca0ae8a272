package renew

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Renewer renews leases over one LeaseKeepAlive stream, a Keeper's or a
// lone session's, every third of their TTL. An answer moves the deadline
// (Session.Renewed) to its request's send time plus the TTL, less the loss
// margin (a lease's answers come in request order). The loop only decides what is due; the stream's own
// goroutines do the I/O, so that a blocked send holds up neither.
//
// A session ends at its deadline less how late the renewer's timer has
// lately fired (lag): on a machine that runs this process late, the
// wake-up that ends a session is aimed early by as much, so that Done
// still closes ahead of etcd's expiry if the process runs no later than
// it lately has.
type Renewer struct {
	// lag is how late the loop's timer has fired lately, in real time:
	// the process's and the machine's lateness, which the loop aims off.
	// aim is lag as it stood when the loop last went to sleep: the check
	// on waking uses it, so that a wake-up's own lateness (the process was
	// stopped, say) never ends a session that a keep-alive can still save.
	lag lagMeter
	aim time.Duration

	client   *clientv3.Client
	clock    Clock
	batch    time.Duration   // how early a keep-alive may go out, for renewals to share a wake-up
	maxRetry time.Duration   // the longest pause before a failed stream is opened again
	ctx      context.Context // the loop runs until it ends
	done     chan struct{}   // closed when the loop has stopped
	wake     chan struct{}   // poked when a session is added

	// mu guards sessions, their renewal state and outbox. Lock order: a
	// Keeper's mu, then mu, then a Session's mu (which Deadline takes).
	mu       sync.Mutex
	sessions map[clientv3.LeaseID]*keptSession
	outbox   []int64 // leases whose keep-alive is due, for the stream's sender
}

// Session is what the Renewer needs of a session whose lease it keeps
// alive (package lease's Session). Lease, TTL, Deadline and Ended are
// called with the Renewer's mu held, so they may take the session's own
// mutex but nothing that waits on the Renewer; Lose and Renewed are called
// without it. Sessions are told apart with ==.
type Session interface {
	// Lease is the session's lease, one per session of a Renewer.
	Lease() clientv3.LeaseID
	// TTL is the lease's TTL: its keep-alive goes out every third of it.
	TTL() time.Duration
	// Deadline is when the session takes its lease to end unless renewed.
	Deadline() time.Time
	// Ended is true once the session has ended: the Renewer drops it.
	Ended() bool
	// Lose ends the session, its lease taken for lost, for reason.
	Lose(reason string)
	// Also is a second lease of the session's, renewed in the same send
	// as Lease and just before it; 0 for none. Its answers are not the session's: an answer
	// for it changes nothing.
	Also() clientv3.LeaseID
	// Renewed applies etcd's answer to a keep-alive sent at sent: the TTL
	// in seconds (positive) and the answer header's store revision.
	Renewed(sent time.Time, ttl, revision int64)
}

// Clock is the sessions' local time: the real clock, or the fault suite's
// slow or fast one.
type Clock interface {
	Now() time.Time
	// Real is how long d on this clock lasts in real time.
	Real(d time.Duration) time.Duration
	// Scale is how much of this clock's time d of real time is.
	Scale(d time.Duration) time.Duration
}

// keptSession is a session's renewal state. Renewer.mu guards it.
type keptSession struct {
	s        Session
	nextSend time.Time
	sent     []time.Time // send times of keep-alives not yet answered, oldest first
}

// New starts a Renewer that runs until ctx ends. batch is how early a
// keep-alive may go out, for renewals to share a wake-up; maxRetry, the
// longest pause before a failed stream is opened again.
func New(ctx context.Context, client *clientv3.Client, c Clock, batch, maxRetry time.Duration) *Renewer {
	r := &Renewer{client: client, clock: c, batch: batch, maxRetry: maxRetry, ctx: ctx,
		done: make(chan struct{}), wake: make(chan struct{}, 1), sessions: make(map[clientv3.LeaseID]*keptSession)}
	go r.run()
	return r
}

// Add starts renewing s's lease.
func (r *Renewer) Add(s Session) {
	r.mu.Lock()
	r.sessions[s.Lease()] = &keptSession{s: s}
	r.mu.Unlock()
	poke(r.wake)
}

// Remove stops renewing s's lease, if s (not another session of its
// lease) is kept.
func (r *Renewer) Remove(s Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := s.Lease()
	if e := r.sessions[id]; e != nil && e.s == s {
		delete(r.sessions, id)
	}
}

// Sessions lists the sessions kept now, in no order: a Keeper closes them
// as it closes.
func (r *Renewer) Sessions() []Session {
	var kept []Session
	r.mu.Lock()
	for _, e := range r.sessions {
		kept = append(kept, e.s)
	}
	r.mu.Unlock()
	return kept
}

// Done is closed when the Renewer has stopped, after its ctx ended.
func (r *Renewer) Done() <-chan struct{} { return r.done }

// Lag is how much earlier than their deadlines the Renewer ends sessions
// now, before the cap of a quarter of the TTL.
func (r *Renewer) Lag(now time.Time) time.Duration { return r.lag.get(now) }

// run keeps a stream open until ctx ends, reopening it after a pause.
func (r *Renewer) run() {
	defer close(r.done)
	retry := 50 * time.Millisecond
	for r.ctx.Err() == nil {
		if r.stream() {
			retry = 50 * time.Millisecond
		}
		// Down: keep watching deadlines until it is time to try again.
		until := r.clock.Now().Add(retry)
		for r.ctx.Err() == nil && r.clock.Now().Before(until) {
			r.wait(minTime(r.tick(nil, r.clock.Now()), until), nil)
		}
		retry = min(2*retry, r.maxRetry)
	}
}

// stream runs one stream until it fails or ctx ends.
func (r *Renewer) stream() (answered bool) {
	r.mu.Lock()
	r.outbox = nil
	for _, e := range r.sessions {
		e.nextSend, e.sent = time.Time{}, nil // renew everyone at once on a new stream
	}
	r.mu.Unlock()
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.ctx))
	results, ready := make(chan *pb.LeaseKeepAliveResponse, 1), make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() { r.carry(ctx, results, ready) })
	defer wg.Wait()
	defer cancel() // before waiting: the stream's goroutines may be blocked on results or on a send
	// Ticks only when due or for a new session: an answer only moves a
	// deadline later, and a tick per answer would scan every session.
	for next := r.tick(ready, r.clock.Now()); r.ctx.Err() == nil; {
		resp, failed := r.wait(next, results)
		switch {
		case failed:
			return answered
		case resp != nil:
			answered = true
			r.answer(resp)
		default:
			next = r.tick(ready, r.clock.Now())
		}
	}
	return answered
}

// carry opens the stream (which can wait, for a connection), passes its
// answers on results, closed when it fails, and sends what tick queues.
func (r *Renewer) carry(ctx context.Context, results chan<- *pb.LeaseKeepAliveResponse, ready <-chan struct{}) {
	stream, err := pb.NewLeaseClient(r.client.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		close(results)
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		defer close(results)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case results <- resp:
			case <-ctx.Done():
				return
			}
		}
	})
	r.send(ctx, stream, ready)
}

// send sends what tick queues, each time ready is poked.
func (r *Renewer) send(ctx context.Context, stream pb.Lease_LeaseKeepAliveClient, ready <-chan struct{}) {
	for {
		select {
		case <-ready:
		case <-ctx.Done():
			return
		}
		r.mu.Lock()
		ids := r.outbox
		r.outbox = nil
		r.mu.Unlock()
		// Sent with mu released: a send can block on flow control (etcd not
		// reading), and the deadline checks and session changes take mu.
		for _, id := range ids {
			if stream.Send(&pb.LeaseKeepAliveRequest{ID: id}) != nil {
				return // the stream failed: its receiver reports it
			}
		}
	}
}

// wait sleeps until next, an answer on results (nil: none), a new session
// or the end of ctx; failed if results was closed.
func (r *Renewer) wait(next time.Time, results <-chan *pb.LeaseKeepAliveResponse) (resp *pb.LeaseKeepAliveResponse, failed bool) {
	d := r.clock.Real(next.Sub(r.clock.Now()))
	due := time.Now().Add(d)
	r.aimFromLag(time.Now())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case resp, ok := <-results:
		return resp, !ok
	case <-t.C:
		now := time.Now()
		r.lag.observe(now, now.Sub(due))
	case <-r.wake:
	case <-r.ctx.Done():
	}
	return nil, false
}

// tick queues the keep-alives due (none without a stream: ready nil),
// taking their send time before they are sent, so that deadlines err
// early; it ends sessions past their deadline, less the lag, and returns
// when next due. The next keep-alive is aimed early by the lag as well.
func (r *Renewer) tick(ready chan<- struct{}, now time.Time) time.Time {
	next := now.Add(time.Second)
	lag := r.clock.Scale(r.aim)
	var lost []Session
	r.mu.Lock()
	for id, e := range r.sessions {
		s := e.s
		if s.Ended() {
			delete(r.sessions, id)
			continue
		}
		early := min(lag, maxLag(s.TTL()))
		deadline := s.Deadline().Add(-early)
		if !now.Before(deadline) {
			delete(r.sessions, id)
			lost = append(lost, s)
			continue
		}
		next = minTime(next, deadline)
		if ready == nil {
			continue
		}
		if !e.nextSend.After(now.Add(r.batch)) {
			// Also first: etcd answers a stream's keep-alives in order and
			// ends the stream at an error, so a renewal of the session's
			// lease means its second lease was renewed as well.
			if also := s.Also(); also != 0 {
				r.outbox = append(r.outbox, int64(also))
			}
			r.outbox = append(r.outbox, int64(id))
			e.sent = append(e.sent, now)
			e.nextSend = now.Add(s.TTL()/3 - early) // as early as the deadline, to keep its time to be answered
		}
		next = minTime(next, e.nextSend)
	}
	queued := len(r.outbox) > 0
	r.mu.Unlock()
	if queued {
		poke(ready)
	}
	for _, s := range lost {
		s.Lose("not renewed before the local deadline")
	}
	return next
}

// answer applies a keep-alive answer: a new deadline, or the lease's end.
func (r *Renewer) answer(resp *pb.LeaseKeepAliveResponse) {
	r.mu.Lock()
	e := r.sessions[clientv3.LeaseID(resp.ID)]
	if e == nil || len(e.sent) == 0 {
		r.mu.Unlock()
		return // a session removed since
	}
	at := e.sent[0]
	e.sent = e.sent[1:]
	s := e.s
	if resp.TTL <= 0 {
		delete(r.sessions, s.Lease())
	}
	r.mu.Unlock()
	if resp.TTL <= 0 {
		s.Lose("etcd reports the lease gone")
		return
	}
	s.Renewed(at, resp.TTL, resp.Header.GetRevision())
}

// lagWindow spans many renewals of a 2 s session (one every 667 ms).
//
// Coupled to the lateness aim (maxLag caps it at a quarter of the TTL);
// docs/design.md has the loss margin under load it gives.
const lagWindow = 10 * time.Second

// lagMeter keeps the most a timer fired late in the current window of
// lagWindow and in the one before, so that a lateness counts for one to
// two windows. The zero value is ready.
type lagMeter struct {
	mu        sync.Mutex
	start     time.Time // of the current window
	cur, prev time.Duration
}

func (m *lagMeter) observe(now time.Time, late time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roll(now)
	m.cur = max(m.cur, late)
}

func (m *lagMeter) get(now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roll(now)
	return max(m.cur, m.prev)
}

func (m *lagMeter) roll(now time.Time) {
	switch since := now.Sub(m.start); {
	case since >= 2*lagWindow:
		m.start, m.cur, m.prev = now, 0, 0
	case since >= lagWindow:
		m.start, m.cur, m.prev = m.start.Add(lagWindow), 0, m.cur
	}
}

// aimFromLag sets the aim of the next check from the lateness measured
// up to now.
func (r *Renewer) aimFromLag(now time.Time) { r.aim = r.lag.get(now) }

// maxLag caps how early, for the lag, a session of ttl is ended and its
// keep-alives sent: by a quarter of the TTL, so that a session gives up at
// most 30% of it early (with the loss margin) and renews at most every
// twelfth of it, however late a stopped or starved process woke.
func maxLag(ttl time.Duration) time.Duration { return ttl / 4 }

// poke signals ch, of capacity 1, unless it is signalled already.
func poke(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
