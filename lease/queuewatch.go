package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// idleWatch is how long a name's queue watch outlives the last lock of that
// name on the session, so that a service that takes the same lock again and
// again opens it once.
const idleWatch = 30 * time.Second

// queueWatch is one long-lived watch of the deletions under a lock name,
// serving every lock of that name taken through the session, one after the
// other (the name's gate makes them take turns).
//
// Because it outlives each lock, a lock needs no watch of its own: the
// watch is already delivering events when the lock's key is put, so no
// deletion after that put can be missed, and nothing has to be read again to
// close a gap. A handoff then costs the holder's delete and one event,
// instead of a watch opened, confirmed and cancelled, and two reads, for
// every waiter and every holding. The watch carries deletions only: puts are
// filtered out by etcd, so waiters queueing behind cost the others nothing.
type queueWatch struct {
	s      *Session
	prefix string
	ctx    context.Context
	stop   context.CancelFunc

	// epoch changes whenever the watch comes up or goes down: a lock whose
	// view of the queue was read under another epoch may have missed a
	// deletion and reads the queue again.
	epoch atomic.Uint64

	mu  sync.Mutex
	up  chan struct{} // closed while the watch is up; replaced when it goes down
	sub *Lock         // the lock of this name now waiting or held, if any
}

// startQueueWatch starts the watch of name's queue, owned by the session:
// it stops when the session ends or when stop is called.
func (s *Session) startQueueWatch(name string) (*queueWatch, error) {
	if err := s.track(); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(s.ctx)
	w := &queueWatch{s: s, prefix: name + "/", ctx: ctx, stop: stop, up: make(chan struct{})}
	go w.run()
	return w, nil
}

// run keeps the watch open until the session ends or the watch is stopped,
// opening it again, after a pause, whenever it ends.
func (w *queueWatch) run() {
	defer w.s.wg.Done()
	retry := newBackoff(50*time.Millisecond, time.Second)
	for w.ctx.Err() == nil {
		if w.serve() {
			retry.reset()
		}
		w.down()
		if retry.wait(w.ctx) != nil {
			return
		}
	}
}

// serve runs one watch until it ends, and reports whether it came up. It
// is opened with no start revision, so etcd serves it at once (a start
// revision already in the past would wait for etcd's 100 ms catch-up loop).
// It requires a leader: a member cut off from the quorum ends it rather
// than leaving it silent.
func (w *queueWatch) serve() (cameUp bool) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(w.ctx))
	defer cancel()
	wch := w.s.client.Watch(ctx, w.prefix, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for wr := range wch {
		if wr.Err() != nil {
			return cameUp
		}
		if wr.Created {
			cameUp = true
			if !w.isUp(ctx) {
				return cameUp
			}
			continue
		}
		epoch := w.epoch.Load()
		sub := w.subscriber()
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE && sub != nil {
				sub.deleted(string(ev.Kv.Key), ev.Kv.ModRevision, epoch)
			}
		}
	}
	return cameUp
}

// isUp records that the watch is up, and has a held lock read its key
// again: a deletion while the watch was down was not seen. It reports
// false if that read failed, and the watch should start over.
func (w *queueWatch) isUp(ctx context.Context) bool {
	w.mu.Lock()
	w.epoch.Add(1)
	select {
	case <-w.up:
	default:
		close(w.up)
	}
	sub := w.sub
	w.mu.Unlock()
	if sub == nil {
		return true
	}
	sub.poke()
	return sub.recheck(ctx) == nil
}

// down records that the watch is down.
func (w *queueWatch) down() {
	w.mu.Lock()
	w.epoch.Add(1)
	select {
	case <-w.up:
		w.up = make(chan struct{})
	default:
	}
	sub := w.sub
	w.mu.Unlock()
	if sub != nil {
		sub.poke()
	}
}

func (w *queueWatch) subscriber() *Lock {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sub
}

// subscribe makes l the lock that the watch's events go to, once the watch
// is up, and returns the epoch l's view of the queue starts in. It waits
// for the watch to come up until ctx or the lock ends.
func (w *queueWatch) subscribe(ctx context.Context, l *Lock) (uint64, error) {
	for {
		w.mu.Lock()
		up := w.up
		select {
		case <-up:
			w.sub = l
			epoch := w.epoch.Load()
			w.mu.Unlock()
			return epoch, nil
		default:
		}
		w.mu.Unlock()
		if err := w.awaitUp(ctx, l, up); err != nil {
			return 0, err
		}
	}
}

// upEpoch waits until the watch is up and returns its epoch.
func (w *queueWatch) upEpoch(ctx context.Context, l *Lock) (uint64, error) {
	for {
		w.mu.Lock()
		up := w.up
		w.mu.Unlock()
		if err := w.awaitUp(ctx, l, up); err != nil {
			return 0, err
		}
		epoch := w.epoch.Load()
		w.mu.Lock()
		still := w.up == up
		w.mu.Unlock()
		if still {
			return epoch, nil
		}
	}
}

func (w *queueWatch) awaitUp(ctx context.Context, l *Lock, up chan struct{}) error {
	select {
	case <-up:
		return nil
	case <-l.ctx.Done():
		return context.Cause(l.ctx)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unsubscribe stops the watch's events going to l.
func (w *queueWatch) unsubscribe(l *Lock) {
	w.mu.Lock()
	if w.sub == l {
		w.sub = nil
	}
	w.mu.Unlock()
}
