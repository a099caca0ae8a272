package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/leasefence/leasefence/lease/internal/watch"
)

// gate is one name's turn on a session: locks of one name through one
// session would share one etcd key, so they take turns, in the order they
// came. It also keeps the name's watches, which outlive the last user by
// idleWatch.
type gate struct {
	mu   sync.Mutex
	held bool
	// waiting are the locks waiting for the turn, oldest first: leave
	// hands it to the first by closing its channel. A name taken by one
	// lock at a time makes none of it, and a gate, of which a held lock
	// has one, carries only the pointer.
	waiting *[]chan struct{}
	w       watches
}

// take takes the turn if it is free. Otherwise, unless try is set, it
// queues for it and returns the channel that is closed when the turn is
// handed over.
func (g *gate) take(try bool) (took bool, handed chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.held {
		g.held = true
		return true, nil
	}
	if try {
		return false, nil
	}
	handed = make(chan struct{})
	if g.waiting == nil {
		g.waiting = new([]chan struct{})
	}
	*g.waiting = append(*g.waiting, handed)
	return false, handed
}

// withdraw takes a waiter that gave up off the queue, and reports false
// if it was handed the turn first: it must then hand it on (leave).
func (g *gate) withdraw(handed chan struct{}) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiting == nil {
		return false
	}
	i := slices.Index(*g.waiting, handed)
	if i < 0 {
		return false
	}
	*g.waiting = slices.Delete(*g.waiting, i, i+1)
	return true
}

// leave hands the turn to the oldest waiter, or frees it.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiting == nil || len(*g.waiting) == 0 {
		g.held, g.waiting = false, nil
		return
	}
	close((*g.waiting)[0])
	*g.waiting = slices.Delete(*g.waiting, 0, 1)
}

// watches are a name's long-lived watches on a session (watch.Watch). The
// queue watch is the session's own, or shared by its Keeper's sessions
// (shared set; release gives it back), which keeps the Keeper's copy of
// the queue (mirror, nil for a session's own). A session's own queue watch
// is started by the first lock of the name that needs it (queueWatch):
// nil until then, so that a name only ever taken at once costs none. So
// are the follows, made by the first far waiter (followsFor).
//
//   - The own-key watch starts paused: a waiter opens it before relying on
//     its view, a lock granted at once after ownWatchDelay (so a brief
//     hold is not sent its own Unlock's deletion).
//   - The queue watch serves a lock near the head (nearAhead): the last
//     deletion ahead grants it with no read. A far waiter pauses it.
//   - Watches of keys ahead (follows) serve far waiters, so that a long
//     queue does not send every deletion to every waiter.
type watches struct {
	own *watch.Watch
	// queue is read by the lock that holds the gate, and set once by the
	// first that needs it, which may be a lock that has just ended and
	// handed the gate on: hence atomic, and set under mu unless stopped.
	queue   atomic.Pointer[watch.Watch]
	mu      sync.Mutex
	stopped bool
	follows atomic.Pointer[watch.Follows] // set once, as queue is
	// shared is the Keeper's side of a queue watch it shares; nil for a
	// session's own, so that a name of such a session carries only this.
	shared *keptQueue
}

// keptQueue is a Keeper's queue watch as a name's watches hold it: the
// Keeper's copy of the queue, and the function that gives the watch back.
type keptQueue struct {
	mirror  *queueMirror
	release func()
}

// mirror is the Keeper's copy of the queue; nil for a session's own
// queue watch.
func (w *watches) mirror() *queueMirror {
	if w.shared == nil {
		return nil
	}
	return w.shared.mirror
}

// q is the queue watch, nil before a lock started it.
func (w *watches) q() *watch.Watch { return w.queue.Load() }

// fl is the name's follows, nil before a far waiter made them.
func (w *watches) fl() *watch.Follows { return w.follows.Load() }

// followsFor returns the name's follows, made with start if need be; nil
// once the watches were stopped.
func (w *watches) followsFor(start func(key string) (*watch.Watch, error)) *watch.Follows {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil
	}
	if f := w.follows.Load(); f != nil {
		return f
	}
	f := watch.NewFollows(start, keptFollows)
	w.follows.Store(f)
	return f
}

// setQueue makes started the queue watch, unless one is there already or
// the watches were stopped; it returns the queue watch, or nil once
// stopped. A started watch that is not kept is stopped.
func (w *watches) setQueue(started *watch.Watch) *watch.Watch {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped && w.queue.CompareAndSwap(nil, started) {
		return started
	}
	started.Stop()
	if w.stopped {
		return nil
	}
	return w.queue.Load()
}

func (w *watches) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.own.Stop()
	w.fl().Stop()
	switch q := w.q(); {
	case w.shared != nil:
		w.shared.release()
	case q != nil:
		q.Stop()
	}
}

// sessionOwner is a session as the owner of its watches' goroutines
// (watch.Owner).
type sessionOwner Session

func (o *sessionOwner) Track() error { return (*Session)(o).track() }

func (o *sessionOwner) Untrack() { o.wg.Done() }

// startWatch starts a watch of key, owned by the session: it stops when
// the session ends or Stop is called. A paused one has no goroutine until
// Resume.
func (s *Session) startWatch(key string, paused, prefix bool) (*watch.Watch, error) {
	return watch.Start(watch.Config{Stream: s.stream, Key: key, Prefix: prefix, Paused: paused, RestAfter: restAfter})
}

// openGate makes name's gate and starts its watches, for its first user.
func (s *Session) openGate(name string) (*gate, error) {
	// Paused: a lock granted at once opens it after ownWatchDelay.
	own, err := s.startWatch(lockKey(name, s.id), true, false)
	if err != nil {
		return nil, err
	}
	g := &gate{}
	w := &g.w
	w.own = own
	if s.keeper != nil {
		var q *watch.Watch
		sq := &keptQueue{}
		q, sq.mirror, sq.release, err = s.keeper.queueWatch(name)
		w.queue.Store(q)
		w.shared = sq
	}
	if err != nil {
		own.Stop()
		return nil, err
	}
	return g, nil
}

// enterGate takes the gate of name, waiting for it unless try is set, and
// returns it; the name's watches are the gate's own, which only the lock
// that holds the gate uses. leaveGate gives it back.
func (s *Session) enterGate(ctx context.Context, name string, try bool) (*gateEntry, error) {
	e, err := s.gates.enter(name)
	if err != nil {
		return nil, err
	}
	g := e.v
	took, handed := g.take(try)
	switch {
	case took:
		return e, nil
	case try:
		s.gates.exit(e)
		return nil, fmt.Errorf("%w: held or awaited through this same session", ErrLocked)
	}
	select {
	case <-handed:
		return e, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.ctx.Done():
		err = context.Cause(s.ctx)
	}
	if g.withdraw(handed) {
		s.gates.exit(e)
	} else {
		s.leaveGate(e) // handed the turn as it gave up: hand it on
	}
	return nil, err
}

// gateEntry is a name's gate as the session's registry keeps it.
type gateEntry = entry[*gate]

// leaveGate gives back the gate that enterGate took; once per enterGate.
func (s *Session) leaveGate(e *gateEntry) {
	e.v.leave()
	s.gates.exit(e)
}
