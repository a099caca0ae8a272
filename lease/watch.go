package lease

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/rpcerr"
)

// idleWatch is how long a name's watches outlive the last lock of that name
// on the session, so that a service that takes the same lock again and
// again opens them once. Not longer: a session that stopped locking the
// name would be sent every deletion the others' handoffs make (with four
// contenders of which one went on alone, 3 messages per lock and release
// of that one, for 30 s when this was 30 s), and opening them again costs
// a lock that waits no more than it costs a session the first time.
const idleWatch = time.Second

// keyWatch is one long-lived watch of deletions, of the session's own key
// for a name, of the whole queue under the name, or of one key ahead in
// it, serving every lock of that name taken through the session, one
// after the other (the name's gate makes them take turns).
//
// Because it outlives each lock, a lock opens no watch of its own in the
// common cases: the watch already delivers events when the lock's key is
// put, so no deletion after that put can be missed and nothing has to be
// read again to close a gap. A watch of a key ahead carries deletions
// only (etcd filters the puts out); the own-key and queue watches carry
// puts too, so that a put by someone else on the own key reaches the lock
// in order with the deletions it waits for (see serve).
//
//   - The own-key watch (one key: name/lease) tells a holder, or a
//     waiter, that its key was deleted. It starts paused: a waiter opens
//     it before it relies on its view, and a lock granted as its key is
//     put opens it only once held for ownWatchDelay, so that a lock held
//     briefly is not sent its own Unlock's deletion. Once open it stays
//     open while the name is in use, until restAfter locks in a row were
//     granted at once and held briefly (granted).
//   - The queue watch (the prefix name/) is on only while a lock of the
//     session is near the head of the queue (nearAhead): there, every
//     deletion ahead shrinks the waiter's view of the queue, and the last
//     one grants it the lock with no read at all. It rests again once
//     restAfter locks in a row were granted at once. Further back, a waiter
//     pauses it and follows only the two newest keys ahead of it, so that
//     a long queue does not send every deletion to every waiter.
//   - The watches of keys ahead (follows: one key each, up to keptFollows
//     per name) serve those far waiters. Lock keys are named by session,
//     so a session that queues behind the same sessions again (as steady
//     contenders do) finds their watches up, and reads nothing to start
//     following them.
type keyWatch struct {
	client *clientv3.Client
	owner  watchOwner // the session, or the Keeper for a queue watch shared by its sessions
	key    string
	opts   []clientv3.OpOption // the range (WithPrefix) and filters it asks etcd for
	mirror *queueMirror        // a Keeper's copy of the queue, kept by this watch; nil for a session's own watches
	ctx    context.Context
	stop   context.CancelFunc

	// epoch grows by one whenever the watch comes up or goes down: it is
	// odd exactly while the watch is up. A lock whose view was read under
	// another epoch may have missed a deletion and reads it again.
	epoch atomic.Uint64
	// upRev is the store revision the watch last came up at: it reports
	// every change after it.
	upRev atomic.Int64
	// quiet counts the locks in a row that did not need the watch
	// (granted).
	quiet atomic.Int32
	// seenRev is the store revision of the last response the watch handed
	// to its subscribers (stored before it does): a lock that subscribes
	// later has missed what came before, and reads at least this revision.
	seenRev atomic.Int64

	mu      sync.Mutex
	running bool          // run has started (a paused watch starts it on resume)
	up      chan struct{} // closed while the watch is up; replaced when it goes down
	refused chan struct{} // closed when etcd refuses the watch for good (refusal says why)
	refusal error
	// subs are the locks of this name now waiting or held: usually one,
	// so a slice (a map cost 0.1 KB more per held lock).
	subs     []*Lock
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

func (s *Session) untrack() { s.wg.Done() }

// startWatch starts a watch of key (of everything under it if prefix is
// set), owned by the session: it stops when the session ends or when stop
// is called. A paused watch opens nothing, and has no goroutine, until
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

// launch starts run, once, registered with the session. w.mu is held.
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

// run keeps the watch open until the session ends or the watch is stopped,
// opening it again, after a pause, whenever it ends while wanted.
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
// next opening and the function that ends it (which pause calls too);
// false once the watch is stopped.
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

// serve runs one watch until it ends, and reports whether it came up; its
// caller ends ctx after. It is opened with no start revision, so etcd
// serves it at once (a start revision already in the past would wait for
// etcd's 100 ms catch-up loop). It requires a leader (ctx carries the
// metadata, from startWatch's parent): a member cut off from the quorum
// ends it rather than leaving it silent. A watch that keeps a mirror also
// receives puts, and fills the mirror when it comes up.
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
			if w.mirror != nil && !w.mirror.load(ctx, w.client, w.key, wr.Header.Revision, w.epoch.Load()) {
				return cameUp
			}
			continue
		}
		epoch := w.epoch.Load()
		if w.mirror != nil {
			w.mirror.apply(w.key, wr.Events, epoch)
		}
		for _, sub := range w.subscribers() {
			sub.deleted(w, wr.Events, epoch)
		}
	}
	return cameUp
}

// isUp records that the watch is up, and tells its subscribers. It
// reports false if one of them could not catch up (sourceUp), and the
// watch should start over.
func (w *keyWatch) isUp(ctx context.Context) bool {
	w.mu.Lock()
	if w.epoch.Load()%2 == 0 {
		w.epoch.Add(1)
		close(w.up)
	}
	epoch := w.epoch.Load()
	w.mu.Unlock()
	for _, sub := range w.subscribers() {
		// Opened with no start revision, the watch reports every change
		// after the revision it came up at.
		if sub.sourceUp(ctx, w, epoch, w.upRev.Load()+1) != nil {
			return false
		}
	}
	return true
}

// refuse records that etcd refused the watch outright (no permission,
// say): callers waiting for it to come up get err instead of waiting on.
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
	if w.epoch.Load()%2 == 1 {
		w.epoch.Add(1)
		w.up = make(chan struct{})
	}
	epoch := w.epoch.Load()
	w.mu.Unlock()
	if w.mirror != nil {
		w.mirror.drop()
	}
	for _, sub := range w.subscribers() {
		sub.sourceDown(w, epoch)
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

// resume opens a paused watch again. If the session has ended it does
// nothing: the watch's waiters end with the session.
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

// restAfter is how many locks of a name in a row that did not need the
// name's queue watch, or its own-key watch, pause that watch (granted).
// While it runs, the queue watch sends every deletion under the name, a
// lock's own Unlock's too, and a Keeper's also every put, to keep its
// copy; the own-key watch, once a waiter has opened it, sends each
// Unlock's deletion. For a name no longer contended that was the whole of
// its stream traffic. Paused, they cost nothing: the next lock that has
// to wait opens them again (wait), reading its view once they are up; a
// Keeper's locks read as they queue until then; a lock held for
// ownWatchDelay opens its own-key watch (grant). Eight in a row keep a
// name that is contended now and then from closing and opening them for
// each lock.
const restAfter = 8

// granted is told, by each lock of the name, whether it was one the
// watch was not needed for (Lock.restQueue, Lock.restOwn); restAfter such
// locks in a row pause the watch, and it reports whether this one did.
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

func (w *keyWatch) subscribers() []*Lock {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.subs)
}

// subscribe makes l one of the locks that the watch's events go to, and
// returns the epoch l's view starts in: an even one (never current) if the
// watch is not up.
func (w *keyWatch) subscribe(l *Lock) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Contains(w.subs, l) {
		w.subs = append(w.subs, l)
	}
	return w.epoch.Load()
}

// upEpoch opens the watch if it is paused, waits until it is up and
// returns its epoch, until ctx or the lock ends.
func (w *keyWatch) upEpoch(ctx context.Context, l *Lock) (uint64, error) {
	w.resume()
	for {
		w.mu.Lock()
		up := w.up
		w.mu.Unlock()
		select {
		case <-up:
		case <-w.refused:
			return 0, w.refusal
		case <-l.ctx.Done():
			return 0, context.Cause(l.ctx)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if epoch := w.epoch.Load(); epoch%2 == 1 {
			return epoch, nil
		}
	}
}

// unsubscribe stops the watch's events going to l.
func (w *keyWatch) unsubscribe(l *Lock) {
	w.mu.Lock()
	w.subs = slices.DeleteFunc(w.subs, func(s *Lock) bool { return s == l }) // zeroes the tail: l is not kept alive
	w.mu.Unlock()
}
