package watch

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// Watch is one long-lived watch, of a session's own key for a name, of
// the queue under the name, or of one key ahead, serving the session's
// locks of that name in turn (or a Keeper's sessions). Usually up before
// a lock's key is put, it then misses no deletion after the put. Every
// watch carries puts as well as deletions: the own-key and queue watches
// need them, so that someone else's put on the own key comes in order
// with the deletions the lock waits for; a watch of a key ahead delivers
// the puts on that key too, which a waiter ignores. Those two pause after
// RestAfter locks in a row that did not need them (Granted). It runs on
// its owner's Stream, with no goroutine of its own.
type Watch struct {
	stream *Stream
	key    string
	// keeper is a Keeper's copy of the queue, kept by this watch, and the
	// locks that hear through it; nil for a session's own watches, which
	// are most of them (one per held lock) and so carry none of it.
	keeper *copied

	restAfter int32        // Config.RestAfter
	quiet     atomic.Int32 // locks in a row that did not need the watch (Granted)

	// epoch grows by one as the watch comes up or goes down: odd exactly
	// while up. A view read under another epoch may have missed a deletion.
	epoch atomic.Uint64
	upRev atomic.Int64 // the revision it last came up at; it reports every change after
	// seenRev is the revision of the last response handed on (stored
	// before): a lock that subscribes later reads at least this revision.
	seenRev atomic.Int64

	mu   sync.Mutex
	up   *upNews      // made by the first to wait for the watch (UpEpoch) or etcd's refusal
	subs []subscriber // locks of this name waiting or held (a map cost 0.1 KB more per lock)

	// Guarded by stream.mu: its creation on the live stream, and when to
	// create it again after a failure (after retryDelay, doubling with
	// each failure in a row: retries).
	reg     *reg
	retryAt *time.Timer

	imu   sync.Mutex // guards inbox and draining
	inbox []item     // what the stream heard for the watch, not yet handed on

	// Flags, together so that a watch, of which a held lock has one,
	// spends one word on them; each is guarded as said.
	prefix   bool  // Config.Prefix; set at Start
	paused   bool  // mu: the watch is off until resume
	stopped  bool  // mu: Stop was called
	draining bool  // imu: a goroutine is handing the inbox on
	retries  uint8 // stream.mu: failures in a row (retryDelay)
}

// upNews is what those who wait for a watch to come up learn: news is
// closed (and forgotten) when it comes up or etcd refuses it, and
// refusal says why etcd refused it, once it did. A watch that nobody
// waits on and etcd never refused, such as a held lock's, has none.
type upNews struct {
	news    chan struct{}
	refusal error
}

// copied is a Keeper's copy of the queue, kept by its shared queue
// watch, and the locks that hear the watch's events through it (viaCopy):
// downs only. They are kept apart from the watch's other subscribers so
// that an event costs nothing per waiter on the copy.
type copied struct {
	c    Copy
	subs []subscriber
}

// copyOf is w's copy, nil for none.
func (w *Watch) copyOf() Copy {
	if w.keeper == nil {
		return nil
	}
	return w.keeper.c
}

// retryDelay is how long after a failure the watch is created again: 50
// ms, doubling with each failure in a row up to a second.
func (w *Watch) retryDelay() time.Duration {
	d := min(50*time.Millisecond<<min(w.retries, 5), time.Second)
	w.retries = min(w.retries+1, 6)
	return d
}

// rangeEnd is the end of the watch's range: nil for its key alone.
func (w *Watch) rangeEnd() []byte {
	if !w.prefix {
		return nil
	}
	return []byte(clientv3.GetPrefixRangeEnd(w.key))
}

// item is one thing the stream heard for a watch: a response of creation
// reg (created, or events), or that the watch went down (err: why etcd
// refused to create it, if it did).
type item struct {
	resp *pb.WatchResponse
	reg  *reg
	down bool
	err  error
}

// Config is what Start starts a watch with.
type Config struct {
	// Stream carries the watch: the session's, or the Keeper's for a
	// queue watch shared by its sessions.
	Stream *Stream
	Key    string
	Prefix bool // watch every key under Key
	// Copy is a Keeper's copy of the queue, kept by the watch; nil for a
	// session's own watches.
	Copy Copy
	// Paused starts the watch paused: it has no etcd watch until Resume.
	Paused bool
	// RestAfter is how many locks in a row that did not need the watch
	// pause it (Granted).
	RestAfter int32
}

// Owner owns a stream's goroutines: Track registers one (failing once
// the owner has ended), Untrack marks it stopped.
type Owner interface {
	Track() error
	Untrack()
}

// Copy is what a watch keeps of its range for a Keeper: it is loaded as
// the watch comes up, fed its events, and dropped as it goes down, all in
// the order the watch hands things on.
type Copy interface {
	// Load reads the keys under prefix at created or later, and makes
	// them the copy of epoch. It reports false if the read failed: the
	// watch then starts over.
	Load(ctx context.Context, cli *clientv3.Client, prefix string, created int64, epoch queue.Epoch) bool
	// Apply moves the copy of epoch forward by one response's events.
	Apply(prefix string, events []*mvccpb.Event, epoch queue.Epoch)
	// Drop drops the copy as the watch goes down.
	Drop()
}

// Epoch is the watch's epoch as of now.
func (w *Watch) Epoch() queue.Epoch { return queue.Epoch(w.epoch.Load()) }

// UpRev is the revision the watch last came up at: it reports every
// change after it.
func (w *Watch) UpRev() int64 { return w.upRev.Load() }

// SeenRev is the revision of the last response handed on: a lock that
// subscribes later reads at least this revision.
func (w *Watch) SeenRev() int64 { return w.seenRev.Load() }

// Key is the key (or prefix) the watch watches.
func (w *Watch) Key() string { return w.key }

// Stop stops the watch for good; one that is open ends its subscriptions
// as it goes down (Listener.Unsubscribed).
func (w *Watch) Stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	inline := w.stream.remove(w)
	w.mu.Unlock()
	if inline {
		w.drain()
	}
}

// Start starts a watch on c.Stream, which stops when the stream ends or
// Stop is called. A paused one has no etcd watch until Resume.
func Start(c Config) (*Watch, error) {
	w := &Watch{stream: c.Stream, key: c.Key, restAfter: c.RestAfter, prefix: c.Prefix, paused: c.Paused}
	if c.Copy != nil {
		w.keeper = &copied{c: c.Copy}
	}
	if !c.Paused {
		w.mu.Lock()
		defer w.mu.Unlock()
		if err := c.Stream.add(w); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// drain hands on the inbox, in order, until it is empty.
func (w *Watch) drain() {
	for {
		w.imu.Lock()
		if len(w.inbox) == 0 {
			w.inbox, w.draining = nil, false
			w.imu.Unlock()
			return
		}
		it := w.inbox[0]
		w.inbox[0] = item{}
		w.inbox = w.inbox[1:]
		w.imu.Unlock()
		w.handOn(it)
	}
}

// handOn hands one item to the copy and the subscribers.
func (w *Watch) handOn(it item) {
	if it.down {
		if it.err != nil {
			w.refuseIf(it.err)
		}
		w.down()
		return
	}
	resp := it.resp
	w.seenRev.Store(max(w.seenRev.Load(), resp.Header.Revision))
	if resp.Created {
		w.upRev.Store(resp.Header.Revision)
		ctx, done := w.stream.upContext(it.reg)
		cp := w.copyOf()
		caughtUp := w.isUp(ctx) && (cp == nil || cp.Load(ctx, w.stream.client, w.key, resp.Header.Revision, w.Epoch()))
		done()
		if !caughtUp {
			w.stream.restart(w, it.reg)
		}
		return
	}
	epoch := w.Epoch()
	if cp := w.copyOf(); cp != nil {
		cp.Apply(w.key, resp.Events, epoch)
	}
	for _, sub := range w.subscribers(false) {
		sub.l.Events(w, sub.src, resp.Events, epoch)
	}
}

// StartOver has the watch, if it is still up in epoch, go down and be
// created again after its backoff: a subscriber could not catch up on
// what it may have missed while it was down, and reads again as it comes
// up.
func (w *Watch) StartOver(epoch queue.Epoch) {
	s := w.stream
	s.mu.Lock()
	r := w.reg
	s.mu.Unlock()
	if r != nil && w.Epoch() == epoch {
		s.restart(w, r)
	}
}

// isUp records that the watch is up and tells its subscribers. It reports
// false if one could not catch up (Listener.Up): the watch starts over.
func (w *Watch) isUp(ctx context.Context) bool {
	w.mu.Lock()
	if !w.Epoch().Up() {
		w.epoch.Add(1)
		w.tellLocked()
	}
	if w.up != nil {
		w.up.refusal = nil // etcd accepts it now: a refusal before is no longer news
	}
	epoch := w.Epoch()
	w.mu.Unlock()
	// With no start revision, it reports every change after upRev. A lock
	// that listens through the copy does so in one epoch only (its
	// queue.Waiter's JoinCopy).
	for _, sub := range w.subscribers(false) {
		if sub.l.Up(ctx, w, sub.src, epoch, w.upRev.Load()+1) != nil {
			return false
		}
	}
	return true
}

// refuseIf records that etcd refused the watch outright (no permission,
// say), if err says so: callers waiting for it to come up get the refusal
// instead.
func (w *Watch) refuseIf(err error) {
	if err = rpcerr.WatchRefusal(err); err == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up == nil {
		w.up = &upNews{}
	}
	if w.up.refusal == nil {
		w.up.refusal = err
		w.tellLocked()
	}
}

// Refused is why etcd refused the watch the last time it was created,
// or nil if it has come up since or was never refused.
func (w *Watch) Refused() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up == nil {
		return nil
	}
	return w.up.refusal
}

// tellLocked wakes whoever waits for the watch to come up (UpEpoch).
// w.mu is held.
func (w *Watch) tellLocked() {
	if w.up != nil && w.up.news != nil {
		close(w.up.news)
		w.up.news = nil
	}
}

// down records that the watch is down.
func (w *Watch) down() {
	w.mu.Lock()
	if w.Epoch().Up() {
		w.epoch.Add(1)
	}
	epoch := w.Epoch()
	w.mu.Unlock()
	if cp := w.copyOf(); cp != nil {
		cp.Drop()
	}
	// Stopped for good, the watch ends its subscriptions: each lock's
	// rule forgets it in the same step, and it sends nothing more.
	w.mu.Lock()
	ended := w.stopped || w.stream.ctx.Err() != nil
	w.mu.Unlock()
	for _, sub := range w.subscribers(true) {
		if ended {
			sub.l.Unsubscribed(w)
		} else {
			sub.l.Down(sub.src, epoch)
		}
	}
}

// Pause closes the watch until Resume, and reports whether it was open.
// It takes the watch off its stream before a Resume can see it paused.
func (w *Watch) Pause() bool {
	w.mu.Lock()
	if w.paused || w.stopped {
		w.mu.Unlock()
		return false
	}
	w.paused = true
	inline := w.stream.remove(w)
	w.mu.Unlock()
	if inline {
		w.drain()
	}
	return true
}

// Resume opens a paused watch again; once its stream has ended, it does
// not.
func (w *Watch) Resume() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.paused || w.stopped {
		return
	}
	if w.stream.add(w) == nil {
		w.paused = false
	}
}

// Granted is told by each lock of the name whether it did not need the
// watch; RestAfter such in a row pause it. It reports whether this one did.
func (w *Watch) Granted(unneeded bool) (paused bool) {
	if !unneeded {
		w.quiet.Store(0)
		return false
	}
	if w.quiet.Add(1) < w.restAfter {
		return false
	}
	w.quiet.Store(0)
	return w.Pause()
}

// Paused tells whether the watch is paused.
func (w *Watch) Paused() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.paused
}

// Listener is a lock as its watches see it: what a watch tells a
// subscriber, and when the subscriber has ended. A watch calls it with no
// lock of its own held.
type Listener interface {
	// Events hands on one response's events of subscription src, in
	// revision order, in epoch.
	Events(w *Watch, src queue.Source, evs []*mvccpb.Event, epoch queue.Epoch)
	// Up says that src came up in epoch, delivering every change of w's
	// range from start on; an error ends the watch's turn at the news.
	Up(ctx context.Context, w *Watch, src queue.Source, epoch queue.Epoch, start int64) error
	// Down says that src went down, ending epoch-1.
	Down(src queue.Source, epoch queue.Epoch)
	// Unsubscribed says that w, stopped for good, ended the subscription.
	Unsubscribed(w *Watch)
	// Done is closed once the subscriber has ended; Cause is nil until
	// then, and then says why.
	Done() <-chan struct{}
	Cause() error
	// SubscribeTo subscribes the lock to w (a follow watch), unless it is
	// subscribed, and returns w's epoch.
	SubscribeTo(w *Watch) queue.Epoch
}

// subscriber is one lock's subscription to the watch: src names it to
// the lock's rule.
type subscriber struct {
	l   Listener
	src queue.Source
}

// ended tells whether l has ended.
func ended(l Listener) bool {
	// Not through Done: a held lock that nobody waits on would make its
	// channel only for this (0.1 KB).
	return l.Cause() != nil
}

// subscribers lists the subscribers to the watch's events, and with
// viaCopy also those through its copy. The copy's waiters are kept apart
// so that an event costs nothing per waiter on the copy.
func (w *Watch) subscribers(viaCopy bool) []subscriber {
	w.mu.Lock()
	defer w.mu.Unlock()
	if viaCopy && w.keeper != nil {
		return slices.Concat(w.subs, w.keeper.subs)
	}
	return slices.Clone(w.subs)
}

// listOf is the list of subscribers l is in, and its index there; nil if
// none. w.mu is held.
func (w *Watch) listOf(l Listener) (*[]subscriber, int) {
	is := func(s subscriber) bool { return s.l == l }
	if i := slices.IndexFunc(w.subs, is); i >= 0 {
		return &w.subs, i
	}
	if w.keeper == nil {
		return nil, -1
	}
	if i := slices.IndexFunc(w.keeper.subs, is); i >= 0 {
		return &w.keeper.subs, i
	}
	return nil, -1
}

// Subscribe makes l a subscriber under a serial that listen hands out, if
// it is not one already and has not ended. It returns the watch's epoch
// (even if the watch is not up), the revision of the last response
// handed on (read after l joined, so l misses nothing after it), and the
// new subscription's serial (0 if none was made).
func (w *Watch) Subscribe(l Listener, viaCopy bool, listen func() queue.Source) (epoch queue.Epoch, seen int64, src queue.Source) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// An ended lock is not added back: its end unsubscribes it only after
	// the lock's context ends, so a late subscribe (a lock re-reading as
	// it ends) would otherwise stay on a Keeper's shared watch for good.
	if list, _ := w.listOf(l); !ended(l) && list == nil {
		src = listen()
		sub := subscriber{l: l, src: src}
		if viaCopy {
			if w.keeper == nil {
				w.keeper = &copied{} // never so in use: only a Keeper's watch has subscribers via its copy
			}
			w.keeper.subs = append(w.keeper.subs, sub)
		} else {
			w.subs = append(w.subs, sub)
		}
	}
	return w.Epoch(), w.seenRev.Load(), src
}

// Subscribed returns the watch's epoch if l is a subscriber.
func (w *Watch) Subscribed(l Listener) (queue.Epoch, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	list, _ := w.listOf(l)
	return w.Epoch(), list != nil
}

// UpEpoch opens the watch if paused and returns its epoch once it is up;
// it fails if etcd refuses the watch, or ctx or the lock ends.
func (w *Watch) UpEpoch(ctx context.Context, l Listener) (queue.Epoch, error) {
	w.Resume()
	for {
		w.mu.Lock()
		if epoch := w.Epoch(); epoch.Up() {
			w.mu.Unlock()
			return epoch, nil
		}
		if w.up == nil {
			w.up = &upNews{}
		}
		if err := w.up.refusal; err != nil {
			w.mu.Unlock()
			return 0, err
		}
		if w.up.news == nil {
			w.up.news = make(chan struct{})
		}
		news := w.up.news
		w.mu.Unlock()
		select {
		case <-news:
		case <-l.Done():
			return 0, l.Cause()
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Unsubscribe ends l's subscription, if any, and returns its serial.
func (w *Watch) Unsubscribe(l Listener) (src queue.Source, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	list, i := w.listOf(l)
	if list == nil {
		return 0, false
	}
	src = (*list)[i].src
	*list = slices.Delete(*list, i, i+1) // zeroes the tail: l is not kept alive
	return src, true
}
