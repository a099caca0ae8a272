package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keeperBatch is how early a Keeper may renew a lease, so that the renewals
// of many sessions go out together: one wake-up of its loop sends every one
// that is due within it. Renewing early is always safe.
const keeperBatch = 100 * time.Millisecond

// Keeper renews the leases of many sessions over one keep-alive stream,
// with one goroutine and one timer for them all, where each session on its
// own keeps a stream, two goroutines and two timers. It also shares each
// lock name's queue watch among its sessions: a put or a deletion in a
// queue reaches the process once, however many of its sessions wait there,
// and keeps a copy of the queue in order that their locks wait on: an
// enqueue is a put alone, a deletion wakes only the waiters it grants, and
// they are granted without a read, however long the queue. A name with
// more than 4,096 keys under it has no copy, and its locks read as they
// queue, until it is down to 2,048 keys: the watch counts them meanwhile,
// and then reads the copy again. While nobody else is queued on a name
// (restAfter locks in a row), the watch rests and the name's locks read as
// they queue, as a session's own would, until one has to wait. A service that holds many
// sessions on one client (a session per tenant, per shard or per worker,
// say) makes one Keeper and passes it to each with WithKeeper.
//
// Each session keeps its own conservative deadline, from the send time of
// its own keep-alives, and loses its lease exactly as it would on its own
// stream; the Keeper only shares the stream and the timer. Its methods are
// safe for concurrent use.
type Keeper struct {
	client *clientv3.Client
	ctx    context.Context
	cancel context.CancelFunc
	// leaderCtx is ctx with etcd's require-leader metadata, the parent of
	// its streams (the keep-alive, the shared queue watches).
	leaderCtx context.Context
	done      chan struct{}

	mu       sync.Mutex
	sessions map[clientv3.LeaseID]*keptSession
	queues   map[string]*sharedQueue // queue watches shared by the sessions, by lock name
	closed   bool
	wake     chan struct{}  // poked when a session is added
	wg       sync.WaitGroup // the queue watches' goroutines
}

// sharedQueue is a lock name's queue watch, shared by every session of a
// Keeper that uses the name: one message per deletion reaches the process,
// however many of its sessions wait on the name.
type sharedQueue struct {
	w *keyWatch
	lingering
}

// keptSession is a session's renewal state in a Keeper. k.mu guards it.
type keptSession struct {
	s        *Session
	nextSend time.Time
	sent     []time.Time // send times of keep-alives not yet answered, oldest first
}

// NewKeeper starts a Keeper for client. A nil client gives an error
// wrapping ErrInvalidArgument. Close stops it.
func NewKeeper(client *clientv3.Client) (*Keeper, error) {
	if client == nil {
		return nil, failed("keeper", errNilClient)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Keeper{client: client, ctx: ctx, cancel: cancel, leaderCtx: clientv3.WithRequireLeader(ctx), done: make(chan struct{}),
		sessions: make(map[clientv3.LeaseID]*keptSession), queues: make(map[string]*sharedQueue),
		wake: make(chan struct{}, 1)}
	go k.run()
	return k, nil
}

// WithKeeper makes the session renew its lease through k, which must be a
// Keeper of the same client. A nil Keeper is refused.
func WithKeeper(k *Keeper) Option {
	return func(o *options) error {
		if k == nil {
			return fmt.Errorf("%w: nil Keeper", ErrInvalidArgument)
		}
		o.keeper = k
		return nil
	}
}

// Close stops the Keeper, first closing every session still renewed
// through it (their locks end with ErrSessionClosed). It waits for its
// goroutine. A second Close returns ErrSessionClosed.
func (k *Keeper) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return failed("keeper", ErrSessionClosed)
	}
	k.closed = true
	var left []*Session
	for _, e := range k.sessions {
		left = append(left, e.s)
	}
	k.mu.Unlock()
	var errs []error
	for _, s := range left {
		if err := s.Close(); err != nil && !errors.Is(err, ErrSessionClosed) {
			errs = append(errs, err)
		}
	}
	k.mu.Lock()
	for _, q := range k.queues {
		q.stop()
	}
	k.mu.Unlock()
	k.cancel()
	<-k.done
	k.wg.Wait()
	return errors.Join(errs...)
}

// track registers a queue watch's goroutine, until the Keeper closes.
func (k *Keeper) track() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("keeper: %w", ErrSessionClosed)
	}
	k.wg.Add(1)
	return nil
}

func (k *Keeper) untrack() { k.wg.Done() }

// queueWatch returns name's shared queue watch, started if need be.
// releaseQueue gives it back.
func (k *Keeper) queueWatch(name string) (*keyWatch, error) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, fmt.Errorf("keeper: %w", ErrSessionClosed)
	}
	q := k.queues[name]
	if q == nil {
		// Started paused, so that its goroutine is launched (resume) with
		// k.mu released: launching registers it with the Keeper.
		w, err := startWatch(k.leaderCtx, k.client, k, name+"/", true, true)
		if err != nil {
			k.mu.Unlock()
			return nil, err
		}
		w.mirror = newQueueMirror()
		q = &sharedQueue{w: w}
		q.drop = func() { k.dropQueue(name, q) }
		k.queues[name] = q
	}
	q.join()
	k.mu.Unlock()
	q.w.resume()
	return q.w, nil
}

// releaseQueue gives back a queue watch; it stops idleWatch after its last
// user unless another comes first.
func (k *Keeper) releaseQueue(name string, w *keyWatch) {
	k.mu.Lock()
	defer k.mu.Unlock()
	q := k.queues[name]
	if q == nil || q.w != w {
		return
	}
	q.leave()
}

// dropQueue stops a queue watch that no session has used for idleWatch.
func (k *Keeper) dropQueue(name string, q *sharedQueue) {
	k.mu.Lock()
	if q.inUse() || k.queues[name] != q {
		k.mu.Unlock()
		return
	}
	delete(k.queues, name)
	k.mu.Unlock()
	q.w.stop()
}

// add starts renewing s's lease.
func (k *Keeper) add(s *Session) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return fmt.Errorf("keeper: %w", ErrSessionClosed)
	}
	k.sessions[s.id] = &keptSession{s: s}
	select {
	case k.wake <- struct{}{}:
	default:
	}
	return nil
}

// remove stops renewing s's lease.
func (k *Keeper) remove(s *Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e := k.sessions[s.id]; e != nil && e.s == s {
		delete(k.sessions, s.id)
	}
}

// run keeps one keep-alive stream open until Close, opening it again after
// a pause whenever it fails. Deadlines are watched all the while.
func (k *Keeper) run() {
	defer close(k.done)
	retry := 50 * time.Millisecond
	for k.ctx.Err() == nil {
		if k.stream() {
			retry = 50 * time.Millisecond
		}
		// Down: keep watching deadlines until it is time to try again.
		until := time.Now().Add(retry)
		for k.ctx.Err() == nil && time.Now().Before(until) {
			k.wait(minTime(k.tick(nil, time.Now()), until), nil)
		}
		retry = min(2*retry, time.Second)
	}
}

// stream runs one keep-alive stream until it fails or the Keeper stops. It
// reports whether it carried an answer.
func (k *Keeper) stream() (answered bool) {
	ctx, cancel := context.WithCancel(k.leaderCtx)
	defer cancel()
	stream, err := pb.NewLeaseClient(k.client.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		return false
	}
	results, stopped := receive(ctx, stream)
	defer stopped()
	defer cancel() // before waiting for the receiver: it may be blocked on results
	k.mu.Lock()
	for _, e := range k.sessions {
		e.nextSend, e.sent = time.Time{}, nil // renew everyone at once on a new stream
	}
	k.mu.Unlock()
	for k.ctx.Err() == nil {
		next := k.tick(stream, time.Now())
		r, ok := k.wait(next, results)
		if !ok {
			continue
		}
		if r.err != nil {
			return answered
		}
		answered = true
		k.answer(r.resp)
	}
	return answered
}

// wait sleeps until next, an answer on results (nil: none), a new session
// or Close.
func (k *Keeper) wait(next time.Time, results <-chan keepAliveResult) (keepAliveResult, bool) {
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	select {
	case r := <-results:
		return r, true
	case <-t.C:
	case <-k.wake:
	case <-k.ctx.Done():
	}
	return keepAliveResult{}, false
}

// tick sends the keep-alives that are due (none if stream is nil), ends
// sessions whose local deadline has passed, drops ended ones, and returns
// when it next has something to do.
func (k *Keeper) tick(stream pb.Lease_LeaseKeepAliveClient, now time.Time) time.Time {
	next := now.Add(time.Second)
	var lost []*Session
	k.mu.Lock()
	for id, e := range k.sessions {
		s := e.s
		if s.ctx.Err() != nil {
			delete(k.sessions, id)
			continue
		}
		deadline := s.Deadline()
		if !now.Before(deadline) {
			delete(k.sessions, id)
			lost = append(lost, s)
			continue
		}
		next = minTime(next, deadline)
		if stream == nil {
			continue
		}
		if !e.nextSend.After(now.Add(keeperBatch)) {
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
				break // the stream failed: its receiver reports it
			}
			e.sent = append(e.sent, now)
			e.nextSend = now.Add(s.ttl / 3)
		}
		next = minTime(next, e.nextSend)
	}
	k.mu.Unlock()
	for _, s := range lost {
		s.lose("not renewed before the local deadline")
	}
	return next
}

// answer applies a keep-alive answer to its session: the deadline moves to
// the request's send time plus the TTL, or the session ends if etcd says
// the lease is gone.
func (k *Keeper) answer(resp *pb.LeaseKeepAliveResponse) {
	k.mu.Lock()
	e := k.sessions[clientv3.LeaseID(resp.ID)]
	if e == nil || len(e.sent) == 0 {
		k.mu.Unlock()
		return // a session removed since, or answered after a restart
	}
	at := e.sent[0]
	e.sent = e.sent[1:]
	s := e.s
	if resp.TTL <= 0 {
		delete(k.sessions, s.id)
	}
	k.mu.Unlock()
	if resp.TTL <= 0 {
		s.lose("etcd reports the lease gone")
		return
	}
	s.extend(at.Add(s.renewedTTL(resp.TTL)), nil)
	s.checkRevision(resp.Header.GetRevision())
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
