package lease

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// keyWatch is one long-lived watch, of the session's own key for a name,
// of the queue under the name, or of one key ahead, serving the session's
// locks of that name in turn (or a Keeper's sessions). Usually up before
// a lock's key is put, it then misses no deletion after the put. Every
// watch carries puts as well as deletions: the own-key and queue watches
// need them, so that someone else's put on the own key comes in order
// with the deletions the lock waits for; a watch of a key ahead delivers
// the puts on that key too, which a waiter ignores. Those two pause after restAfter locks in
// a row that did not need them.
//
//   - The own-key watch starts paused: a waiter opens it before relying on
//     its view, a lock granted at once after ownWatchDelay (so a brief
//     hold is not sent its own Unlock's deletion).
//   - The queue watch serves a lock near the head (nearAhead): the last
//     deletion ahead grants it with no read. A far waiter pauses it.
//   - Watches of keys ahead (follows) serve far waiters, so that a long
//     queue does not send every deletion to every waiter.
type keyWatch struct {
	client *clientv3.Client
	owner  watchOwner // the session, or the Keeper for a queue watch shared by its sessions
	key    string
	opts   []clientv3.OpOption // the range (WithPrefix) and filters it asks etcd for
	mirror *queueMirror        // a Keeper's copy of the queue, kept by this watch; nil for a session's own watches
	ctx    context.Context
	stop   context.CancelFunc

	// epoch grows by one as the watch comes up or goes down: odd exactly
	// while up. A view read under another epoch may have missed a deletion.
	epoch atomic.Uint64
	upRev atomic.Int64 // the revision it last came up at; it reports every change after
	quiet atomic.Int32 // locks in a row that did not need the watch (granted)
	// seenRev is the revision of the last response handed on (stored
	// before): a lock that subscribes later reads at least this revision.
	seenRev atomic.Int64

	mu       sync.Mutex
	running  bool          // run has started (a paused watch starts it on resume)
	up       chan struct{} // closed while the watch is up; replaced when it goes down
	refused  chan struct{} // closed when etcd refuses the watch for good (refusal says why)
	refusal  error
	subs     []subscriber       // locks of this name waiting or held (a map cost 0.1 KB more per lock)
	copySubs []subscriber       // locks that hear the watch's events through its copy (viaCopy): downs only
	paused   bool               // the watch is off until resume
	resumed  chan struct{}      // poked by resume
	endServe context.CancelFunc // ends the current watch, for pause
}

// watchOwner owns a watch's goroutine: track registers it (failing once
// the owner has ended), untrack marks it stopped.
type watchOwner interface {
	track() error
	untrack()
}

// epochNow is the watch's epoch as of now.
func (w *keyWatch) epochNow() queue.Epoch { return queue.Epoch(w.epoch.Load()) }

func (s *Session) untrack() { s.wg.Done() }

// startWatch starts a watch of key, owned by the session: it stops when
// the session ends or stop is called. A paused one has no goroutine until
// resume.
func (s *Session) startWatch(key string, paused bool, opts ...clientv3.OpOption) (*keyWatch, error) {
	return startWatch(s.leaderCtx, s.client, s, key, paused, opts...)
}

// startWatch starts a watch owned by owner, which stops when parent ends.
// parent carries etcd's require-leader metadata (serve).
func startWatch(parent context.Context, client *clientv3.Client, owner watchOwner, key string, paused bool, opts ...clientv3.OpOption) (*keyWatch, error) {
	ctx, stop := context.WithCancel(parent)
	w := &keyWatch{client: client, owner: owner, key: key, opts: opts, ctx: ctx, stop: stop,
		up: make(chan struct{}), refused: make(chan struct{}), paused: paused, resumed: make(chan struct{}, 1)}
	if !paused {
		w.mu.Lock()
		defer w.mu.Unlock()
		if err := w.launch(); err != nil {
			stop()
			return nil, err
		}
	}
	return w, nil
}

// launch starts run, once, registered with the owner. w.mu is held.
func (w *keyWatch) launch() error {
	if w.running {
		return nil
	}
	if err := w.owner.track(); err != nil {
		return err
	}
	w.running = true
	go w.run()
	return nil
}

// run keeps the watch open until it is stopped or its owner ends, opening
// it again, after a backoff, whenever it ends while wanted.
func (w *keyWatch) run() {
	defer w.owner.untrack()
	retry := newBackoff(50*time.Millisecond, time.Second)
	for {
		ctx, endServe, ok := w.wanted()
		if !ok {
			return
		}
		cameUp := w.serve(ctx)
		endServe() // ends etcd's watch if serve returned before it ended
		if cameUp {
			retry.reset()
		}
		w.down()
		if w.isPaused() {
			continue
		}
		if retry.wait(w.ctx) != nil {
			return
		}
	}
}

// wanted waits while the watch is paused, and returns the context of its
// next opening and its cancel (pause calls it too); false once stopped.
func (w *keyWatch) wanted() (context.Context, context.CancelFunc, bool) {
	for {
		w.mu.Lock()
		if !w.paused {
			ctx, cancel := context.WithCancel(w.ctx)
			w.endServe = cancel
			w.mu.Unlock()
			if w.ctx.Err() != nil {
				cancel()
				return nil, nil, false
			}
			return ctx, cancel, true
		}
		w.mu.Unlock()
		select {
		case <-w.resumed:
		case <-w.ctx.Done():
			return nil, nil, false
		}
	}
}

// serve runs one watch until it ends, and reports whether it came up. With
// no start revision etcd serves it at once (a past one would wait for
// etcd's 100 ms catch-up loop). It requires a leader (ctx carries the
// metadata): a member cut off from the quorum ends it instead of leaving
// it silent.
func (w *keyWatch) serve(ctx context.Context) (cameUp bool) {
	opts := append([]clientv3.OpOption{clientv3.WithCreatedNotify()}, w.opts...)
	for wr := range w.client.Watch(ctx, w.key, opts...) {
		if wr.Err() != nil {
			if err := rpcerr.WatchRefusal(wr.Err()); err != nil && !cameUp {
				w.refuse(err)
			}
			return cameUp
		}
		w.seenRev.Store(max(w.seenRev.Load(), wr.Header.Revision))
		if wr.Created {
			cameUp = true
			w.upRev.Store(wr.Header.Revision)
			if !w.isUp(ctx) {
				return cameUp
			}
			if w.mirror != nil && !w.mirror.load(ctx, w.client, w.key, wr.Header.Revision, w.epochNow()) {
				return cameUp
			}
			continue
		}
		epoch := w.epochNow()
		if w.mirror != nil {
			w.mirror.apply(w.key, wr.Events, epoch)
		}
		for _, sub := range w.subscribers(false) {
			sub.l.events(w, sub.src, wr.Events, epoch)
		}
	}
	return cameUp
}

// isUp records that the watch is up and tells its subscribers. It reports
// false if one could not catch up (listener.up): the watch starts over.
func (w *keyWatch) isUp(ctx context.Context) bool {
	w.mu.Lock()
	if !w.epochNow().Up() {
		w.epoch.Add(1)
		close(w.up)
	}
	epoch := w.epochNow()
	w.mu.Unlock()
	// With no start revision, it reports every change after upRev. A lock
	// that listens through the copy does so in one epoch only (joinCopy).
	for _, sub := range w.subscribers(false) {
		if sub.l.up(ctx, w, sub.src, epoch, w.upRev.Load()+1) != nil {
			return false
		}
	}
	return true
}

// refuse records that etcd refused the watch outright (no permission, say):
// callers waiting for it to come up get err instead.
func (w *keyWatch) refuse(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.refusal == nil {
		w.refusal = err
		close(w.refused)
	}
}

// down records that the watch is down.
func (w *keyWatch) down() {
	w.mu.Lock()
	if w.epochNow().Up() {
		w.epoch.Add(1)
		w.up = make(chan struct{})
	}
	epoch := w.epochNow()
	w.mu.Unlock()
	if w.mirror != nil {
		w.mirror.drop()
	}
	// Stopped for good, the watch ends its subscriptions: each lock's
	// rule forgets it in the same step, and it sends nothing more.
	ended := w.ctx.Err() != nil
	for _, sub := range w.subscribers(true) {
		if ended {
			sub.l.unsubscribed(w)
		} else {
			sub.l.down(sub.src, epoch)
		}
	}
}

// pause closes the watch until resume, and reports whether it was open.
func (w *keyWatch) pause() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused {
		return false
	}
	w.paused = true
	if w.endServe != nil {
		w.endServe()
	}
	return true
}

// resume opens a paused watch again; once the owner has ended, it does not.
func (w *keyWatch) resume() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.paused {
		return
	}
	if w.launch() != nil {
		return
	}
	w.paused = false
	select {
	case w.resumed <- struct{}{}:
	default:
	}
}

// granted is told by each lock of the name whether it did not need the
// watch; restAfter such in a row pause it. It reports whether this one did.
func (w *keyWatch) granted(unneeded bool) (paused bool) {
	if !unneeded {
		w.quiet.Store(0)
		return false
	}
	if w.quiet.Add(1) < restAfter {
		return false
	}
	w.quiet.Store(0)
	return w.pause()
}

func (w *keyWatch) isPaused() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.paused
}

// listener is a lock as its watches see it: what a watch tells a
// subscriber, and when the subscriber has ended. A watch calls it with no
// lock of its own held.
type listener interface {
	// events hands on one response's events of subscription src, in
	// revision order, in epoch.
	events(w *keyWatch, src queue.Source, evs []*clientv3.Event, epoch queue.Epoch)
	// up says that src came up in epoch, delivering every change of w's
	// range from start on; an error ends the watch's turn at the news.
	up(ctx context.Context, w *keyWatch, src queue.Source, epoch queue.Epoch, start int64) error
	// down says that src went down, ending epoch-1.
	down(src queue.Source, epoch queue.Epoch)
	// unsubscribed says that w, stopped for good, ended the subscription.
	unsubscribed(w *keyWatch)
	// done is closed once the subscriber has ended, with cause saying why.
	done() <-chan struct{}
	cause() error
	// subscribeTo subscribes the lock to w (a follow watch), unless it is
	// subscribed, and returns w's epoch.
	subscribeTo(w *keyWatch) queue.Epoch
	// nudge wakes the lock to look again: grant, because a deletion may
	// grant it (a Keeper's copy says so); otherwise because something else
	// changed.
	nudge(grant bool)
}

// subscriber is one lock's subscription to the watch: src names it to
// the lock's rule.
type subscriber struct {
	l   listener
	src queue.Source
}

// ended tells whether l has ended.
func ended(l listener) bool {
	select {
	case <-l.done():
		return true
	default:
		return false
	}
}

// subscribers lists the subscribers to the watch's events, and with
// viaCopy also those through its copy. The copy's waiters are kept apart
// so that an event costs nothing per waiter on the copy.
func (w *keyWatch) subscribers(viaCopy bool) []subscriber {
	w.mu.Lock()
	defer w.mu.Unlock()
	if viaCopy {
		return slices.Concat(w.subs, w.copySubs)
	}
	return slices.Clone(w.subs)
}

// listOf is the list of subscribers l is in, and its index there; nil if
// none. w.mu is held.
func (w *keyWatch) listOf(l listener) (*[]subscriber, int) {
	is := func(s subscriber) bool { return s.l == l }
	if i := slices.IndexFunc(w.subs, is); i >= 0 {
		return &w.subs, i
	}
	if i := slices.IndexFunc(w.copySubs, is); i >= 0 {
		return &w.copySubs, i
	}
	return nil, -1
}

// subscribe makes l a subscriber under a serial that listen hands out, if
// it is not one already and has not ended. It returns the watch's epoch
// (even if the watch is not up), the revision of the last response
// handed on (read after l joined, so l misses nothing after it), and the
// new subscription's serial (0 if none was made).
func (w *keyWatch) subscribe(l listener, viaCopy bool, listen func() queue.Source) (epoch queue.Epoch, seen int64, src queue.Source) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// An ended lock is not added back: finish unsubscribes only after the
	// lock's context ends, so a late subscribe (a lock re-reading as it
	// ends) would otherwise stay on a Keeper's shared watch for good.
	if list, _ := w.listOf(l); !ended(l) && list == nil {
		src = listen()
		sub := subscriber{l: l, src: src}
		if viaCopy {
			w.copySubs = append(w.copySubs, sub)
		} else {
			w.subs = append(w.subs, sub)
		}
	}
	return w.epochNow(), w.seenRev.Load(), src
}

// subscribed returns the watch's epoch if l is a subscriber.
func (w *keyWatch) subscribed(l listener) (queue.Epoch, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	list, _ := w.listOf(l)
	return w.epochNow(), list != nil
}

// upEpoch opens the watch if paused and returns its epoch once it is up;
// it fails if etcd refuses the watch, or ctx or the lock ends.
func (w *keyWatch) upEpoch(ctx context.Context, l listener) (queue.Epoch, error) {
	w.resume()
	for {
		w.mu.Lock()
		up := w.up
		w.mu.Unlock()
		select {
		case <-up:
		case <-w.refused:
			return 0, w.refusal
		case <-l.done():
			return 0, l.cause()
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if epoch := w.epochNow(); epoch.Up() {
			return epoch, nil
		}
	}
}

// unsubscribe ends l's subscription, if any, and returns its serial.
func (w *keyWatch) unsubscribe(l listener) (src queue.Source, ok bool) {
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
