package watch

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/lease/internal/backoff"
)

// Stream carries all of an owner's watches on one gRPC watch stream to
// etcd, through etcd's generated client rather than clientv3's Watch,
// which spends a goroutine and about 3.4 KB on each watch. Two goroutines
// serve it however many watches are open: one receives and routes each
// response to its watch, one sends the requests queued for it (never with
// a mutex held). A watch hands on what it hears on a goroutine that runs
// only while it has something to hand on.
//
// etcd answers creates on a stream in the order they were sent (one
// receive loop, one control queue), a refused one with watch ID -1 or the
// ID asked for (by version), and holds a new watch's events until its
// creation is answered: so the oldest create not yet answered is the one
// an answer is for. Each create asks for an ID of its own (etcd 3.4 on
// grant it), and an answer that gives another one proves the order
// broken: the stream starts over rather than route by it.
//
// When the stream fails, every open watch goes down and is created anew,
// with no start revision, on the next stream, after a backoff: it comes
// up in a new epoch, and its subscribers read again (as when etcd loses
// its leader, which ends a stream that requires one).
type Stream struct {
	client *clientv3.Client
	owner  Owner
	ctx    context.Context // carries the require-leader metadata

	mu      sync.Mutex
	running bool                // run has started
	ended   bool                // run has ended: whoever posts hands on too
	open    map[*Watch]struct{} // watches wanted open
	byID    map[int64]*reg      // created on the live stream, by etcd's ID
	pending []*reg              // creates sent on the live stream, not answered yet
	lastID  int64               // the last watch ID asked for: IDs are never reused
	live    *link               // the stream up now; nil while none
	expired string              // a key whose create found the stream's auth token expired (refreshToken)
	drains  sync.WaitGroup      // watches' goroutines handing on (post)
	timers  sync.WaitGroup      // retry timers set and not stopped (retryLocked)
}

// reg is one creation of a watch on a stream.
type reg struct {
	w       *Watch
	id      int64 // the watch ID asked for, and given once created
	created bool  // etcd has answered the create
	gone    bool  // the watch left before etcd answered: cancel it then
	// upping ends the context of the reads its coming up makes
	// (upContext) when it goes down; nil when there is none.
	upping context.CancelFunc
}

// endUp ends the reads of r's coming up, if any. Stream.mu is held.
func (r *reg) endUp() {
	if r.upping != nil {
		r.upping()
		r.upping = nil
	}
}

// upContext is the context of the reads that r's coming up makes
// (Listener.Up, Copy.Load): it ends when r goes down, as a pause or the
// stream's failure makes a read for a watch no longer there pointless.
// Call done when they are over. A watch with a Copy keeps it until it
// goes down, since the copy reads again under it while up (done does not
// end it); any other has it only while it comes up, so that a held lock's
// watch keeps no context.
func (s *Stream) upContext(r *reg) (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(s.ctx)
	s.mu.Lock()
	if r.w.reg == r {
		r.upping = cancel
	} else {
		cancel() // down already
	}
	s.mu.Unlock()
	if r.w.copyOf() != nil {
		return ctx, func() {}
	}
	return ctx, func() {
		s.mu.Lock()
		r.upping = nil
		s.mu.Unlock()
		cancel()
	}
}

// link is one gRPC stream's queue of requests to send.
type link struct {
	queue []*pb.WatchRequest
	poke  chan struct{}
}

// NewStream makes an owner's stream: it opens at its first watch and ends
// with ctx, which must carry etcd's require-leader metadata, so that a
// member cut off from the quorum ends it instead of leaving it silent.
func NewStream(ctx context.Context, client *clientv3.Client, owner Owner) *Stream {
	return &Stream{client: client, owner: owner, ctx: ctx, open: map[*Watch]struct{}{}, byID: map[int64]*reg{}}
}

// add wants w open, starting the stream if need be; it fails once the
// stream has ended. w.mu is held.
func (s *Stream) add(w *Watch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	if !s.running {
		if err := s.owner.Track(); err != nil {
			return err
		}
		s.running = true
		go s.run()
	}
	s.open[w] = struct{}{}
	if s.live != nil && w.reg == nil {
		s.createLocked(w)
	}
	return nil
}

// remove no longer wants w open: it cancels w's etcd watch and queues
// its down, in one step, so that no answer to a later creation can come
// before it. It reports true if the caller must hand the down on
// (postLocked), with no mutex held. w.mu is held.
func (s *Stream) remove(w *Watch) (inline bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.open[w]; !ok {
		return false
	}
	delete(s.open, w)
	s.stopRetryLocked(w)
	s.dropLocked(w)
	return s.postLocked(w, item{down: true})
}

// dropLocked ends w's creation on the live stream, if any. s.mu is held.
func (s *Stream) dropLocked(w *Watch) {
	r := w.reg
	if r == nil {
		return
	}
	w.reg = nil
	r.endUp()
	if !r.created {
		r.gone = true // cancelled when etcd answers the create
		return
	}
	delete(s.byID, r.id)
	s.sendLocked(cancelReq(r.id))
}

// createLocked sends w's create on the live stream. s.mu is held.
func (s *Stream) createLocked(w *Watch) {
	s.lastID++
	r := &reg{w: w, id: s.lastID}
	w.reg = r
	s.pending = append(s.pending, r)
	s.sendLocked(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: []byte(w.key), RangeEnd: w.rangeEnd(), WatchId: r.id,
	}}})
}

func cancelReq(id int64) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
}

// sendLocked queues req for the live stream's sender. s.mu is held.
func (s *Stream) sendLocked(req *pb.WatchRequest) {
	if s.live == nil {
		return
	}
	s.live.queue = append(s.live.queue, req)
	select {
	case s.live.poke <- struct{}{}:
	default:
	}
}

// restart has w, whose subscribers could not catch up as creation r came
// up, start over: down now, created again after a backoff.
func (s *Stream) restart(w *Watch, r *reg) {
	s.mu.Lock()
	if w.reg != r {
		s.mu.Unlock()
		return // already down, or created again
	}
	s.dropLocked(w)
	s.retryLocked(w)
	inline := s.postLocked(w, item{down: true})
	s.mu.Unlock()
	if inline {
		w.drain()
	}
}

// retryLocked creates w again after its backoff, if it is still wanted
// then: on the live stream, or else on the next (serve creates each open
// watch with no retry due). s.mu is held.
func (s *Stream) retryLocked(w *Watch) {
	s.stopRetryLocked(w)
	if s.ctx.Err() != nil {
		return // the stream is ending: nothing is created again
	}
	var t *time.Timer
	s.timers.Add(1)
	t = time.AfterFunc(w.retryDelay(), func() {
		defer s.timers.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.retryAt != t {
			return // stopped, or replaced by a later retry
		}
		w.retryAt = nil
		if _, ok := s.open[w]; ok && w.reg == nil && s.live != nil && !s.ended {
			s.createLocked(w)
		}
	})
	w.retryAt = t
}

// stopRetryLocked stops w's retry timer, if any; the stream's end waits
// for a callback that Stop was too late to prevent. s.mu is held.
func (s *Stream) stopRetryLocked(w *Watch) {
	if w.retryAt != nil && w.retryAt.Stop() {
		s.timers.Done()
	}
	w.retryAt = nil
}

// run keeps the stream open until its context ends, opening it again
// after a backoff whenever it fails.
func (s *Stream) run() {
	defer s.owner.Untrack()
	retry := backoff.New(50*time.Millisecond, time.Second)
	for s.ctx.Err() == nil {
		answered := s.serve()
		s.fall(false)
		// A stream that met an expired token backs off as a failed one
		// does, in case the token cannot be renewed.
		if !s.refreshToken() && answered {
			retry.Reset()
		}
		if retry.Wait(s.ctx) != nil {
			break
		}
	}
	s.fall(true)
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.drains.Wait()
	s.timers.Wait()
}

// serve runs one gRPC stream until it fails, and reports whether etcd
// answered anything on it.
func (s *Stream) serve() (answered bool) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	wc, err := pb.NewWatchClient(s.client.ActiveConnection()).Watch(ctx,
		grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		return false
	}
	l := &link{poke: make(chan struct{}, 1)}
	s.mu.Lock()
	s.live = l
	for w := range s.open {
		if w.reg == nil && w.retryAt == nil {
			s.createLocked(w)
		}
	}
	s.mu.Unlock()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		s.send(ctx, wc, l)
	}()
	defer func() {
		cancel()
		<-sent
	}()
	for {
		resp, err := wc.Recv()
		if err != nil {
			return answered
		}
		answered = true
		if !s.route(resp) {
			return answered // an answer out of order: start over on a new stream
		}
	}
}

// send sends l's queued requests in order until ctx ends or a send fails.
func (s *Stream) send(ctx context.Context, wc pb.Watch_WatchClient, l *link) {
	for {
		select {
		case <-l.poke:
		case <-ctx.Done():
			return
		}
		s.mu.Lock()
		reqs := l.queue
		l.queue = nil
		s.mu.Unlock()
		for _, req := range reqs {
			if wc.Send(req) != nil {
				return
			}
		}
	}
}

// route hands one response to the watch it is for.
// It reports false for a created answer that is not for the oldest create
// unanswered: what passes for etcd (its gRPC proxy, which answers
// creates as they complete) does not keep the order the routing rests
// on, and the stream must not be trusted.
func (s *Stream) route(resp *pb.WatchResponse) bool {
	s.mu.Lock()
	w, it, ok := s.routeLocked(resp)
	inline := w != nil && s.postLocked(w, it)
	s.mu.Unlock()
	if inline {
		w.drain()
	}
	return ok
}

// routeLocked finds the watch resp is for and what to post it; nil if
// none (a watch that has left). ok is false for an answer out of order
// (route). s.mu is held.
func (s *Stream) routeLocked(resp *pb.WatchResponse) (w *Watch, it item, ok bool) {
	if !resp.Created {
		w, it = s.eventsLocked(resp)
		return w, it, true
	}
	if len(s.pending) == 0 {
		return nil, item{}, false
	}
	r := s.pending[0]
	if !resp.Canceled && resp.WatchId != r.id {
		return nil, item{}, false
	}
	s.pending = s.pending[1:]
	switch {
	case resp.Canceled && tokenExpired(resp):
		// Not a refusal: the stream's auth token has expired (etcd's
		// simple tokens do, unused for --auth-token-ttl), and a stream
		// keeps the token it opened with. It starts over (run), with a
		// token the client renews first (refreshToken); every open watch
		// comes up again on it.
		s.expired = r.w.key
		return nil, item{}, false
	case resp.Canceled && r.gone:
		return nil, item{}, true
	case resp.Canceled:
		r.w.reg = nil
		s.retryLocked(r.w)
		return r.w, item{down: true, err: cancelErr(resp)}, true
	case r.gone:
		s.sendLocked(cancelReq(r.id))
		return nil, item{}, true
	}
	r.created = true
	s.byID[r.id] = r
	r.w.retries = 0
	return r.w, item{resp: resp, reg: r}, true
}

// eventsLocked finds the watch of an answer other than a create's:
// events, or etcd's cancel. s.mu is held.
func (s *Stream) eventsLocked(resp *pb.WatchResponse) (*Watch, item) {
	r := s.byID[resp.WatchId]
	if r == nil {
		return nil, item{} // cancelled by us: its down went with the cancel
	}
	if resp.Canceled { // by etcd, once up: compacted, say
		delete(s.byID, r.id)
		r.w.reg = nil
		s.retryLocked(r.w)
		return r.w, item{down: true}
	}
	return r.w, item{resp: resp, reg: r}
}

// fall takes every open watch down as the stream fails; final, as it
// ends for good, also forgets them.
func (s *Stream) fall(final bool) {
	s.mu.Lock()
	s.live, s.pending = nil, nil
	clear(s.byID)
	var downs []*Watch
	for w := range s.open {
		if w.reg != nil || final {
			downs = append(downs, w)
		}
		if w.reg != nil {
			w.reg.endUp()
		}
		w.reg = nil
		if final {
			s.stopRetryLocked(w)
		}
	}
	if final {
		clear(s.open)
	}
	for _, w := range downs {
		s.postLocked(w, item{down: true}) // never inline: run has not ended
	}
	s.mu.Unlock()
}

// postLocked queues it for w's listeners and starts w's goroutine to
// hand it on unless one is running. Once run has ended it reports true
// instead: the caller hands it on (drain) with no mutex held. s.mu is
// held.
func (s *Stream) postLocked(w *Watch, it item) (inline bool) {
	w.imu.Lock()
	defer w.imu.Unlock()
	w.inbox = append(w.inbox, it)
	if w.draining {
		return false
	}
	w.draining = true
	if s.ended {
		return true
	}
	s.drains.Add(1)
	go func() {
		defer s.drains.Done()
		w.drain()
	}()
	return false
}

// tokenExpired tells a create refused for the stream's auth token, which
// a new token cures. (A token older than etcd's auth settings is refused
// otherwise; simple tokens carry the current settings, and etcd's client
// at the library's floor does not name that error.)
func tokenExpired(resp *pb.WatchResponse) bool {
	return errors.Is(cancelErr(resp), rpctypes.ErrInvalidAuthToken)
}

// refreshToken, after a create found the stream's auth token expired
// (routeLocked), has the client renew it before the next stream opens:
// clientv3 asks for a new token when etcd refuses a request for its
// token, and sends the request again. It reports whether it was needed.
// Any error is left to the next stream, which meets the same refusal and
// comes here again after its backoff.
func (s *Stream) refreshToken() bool {
	s.mu.Lock()
	key := s.expired
	s.expired = ""
	s.mu.Unlock()
	if key == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(s.ctx, tokenRefreshTimeout)
	defer cancel()
	_, _ = s.client.Get(ctx, key, clientv3.WithSerializable(), clientv3.WithCountOnly())
	return true
}

// tokenRefreshTimeout bounds refreshToken's request.
const tokenRefreshTimeout = 5 * time.Second

// cancelErr is why etcd cancelled a watch, as clientv3 reports it.
func cancelErr(resp *pb.WatchResponse) error {
	switch {
	case resp.CompactRevision != 0:
		return rpctypes.ErrCompacted
	case resp.CancelReason != "":
		// etcd gives a refused create's gRPC error as its text: the error
		// itself when it is one that a refusal (rpcerr.WatchRefusal) or tokenExpired
		// looks for (wrapped whole, it matched neither).
		for _, e := range []error{rpctypes.ErrGRPCPermissionDenied, rpctypes.ErrGRPCInvalidAuthToken,
			rpctypes.ErrGRPCUserEmpty, rpctypes.ErrGRPCAuthNotEnabled, rpctypes.ErrGRPCInvalidAuthMgmt} {
			if resp.CancelReason == e.Error() {
				return rpctypes.Error(e)
			}
		}
		return rpctypes.Error(status.Error(codes.FailedPrecondition, resp.CancelReason))
	}
	return rpctypes.ErrFutureRev
}
