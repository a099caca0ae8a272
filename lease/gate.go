package lease

import (
	"context"
	"fmt"
	"sync"
)

// gates makes locks of one name taken through one session take turns
// locally: they would share one etcd key, so etcd alone cannot tell them
// apart. It has its own mutex: waiting for a gate never holds up the
// session's keep-alive bookkeeping.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

// gate is one name's turn: a one-place channel, and the number of callers
// holding or waiting for it. It also keeps the name's watches, which
// outlive the last caller by idleWatch before the gate is dropped.
type gate struct {
	ch chan struct{}
	w  watches
	lingering
}

// watches are a name's long-lived watches on a session (see keyWatch): of
// its own key, of the queue, and of single keys ahead (follows). The queue
// watch is the session's own, or shared by every session of its Keeper
// (shared set).
type watches struct {
	own, queue *keyWatch
	follows    *follows
	name       string
	shared     *Keeper
}

func (w watches) stop() {
	w.own.stop()
	w.follows.stop()
	if w.shared != nil {
		w.shared.releaseQueue(w.name, w.queue)
	} else {
		w.queue.stop()
	}
}

// enter takes the gate of name, waiting for it unless try is set, until ctx
// or the session ends. It returns the name's watches, started if need be,
// and a function that gives the gate back.
func (gs *gates) enter(ctx context.Context, s *Session, name string, try bool) (watches, func(), error) {
	g, err := gs.join(s, name)
	if err != nil {
		return watches{}, nil, err
	}
	release := func() {
		<-g.ch
		gs.leave(name, g)
	}
	if try {
		select {
		case g.ch <- struct{}{}:
			return g.w, release, nil
		default:
			gs.leave(name, g)
			return watches{}, nil, fmt.Errorf("%w: held or awaited through this same session", ErrLocked)
		}
	}
	select {
	case g.ch <- struct{}{}:
		return g.w, release, nil
	case <-ctx.Done():
		gs.leave(name, g)
		return watches{}, nil, ctx.Err()
	case <-s.ctx.Done():
		gs.leave(name, g)
		return watches{}, nil, context.Cause(s.ctx)
	}
}

// join counts a caller in on name's gate, making it and its watch if
// needed.
func (gs *gates) join(s *Session, name string) (*gate, error) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.m == nil {
		gs.m = make(map[string]*gate)
	}
	g := gs.m[name]
	if g == nil {
		// Paused: a lock granted as its key is put opens it only once
		// held for ownWatchDelay (see Lock.look).
		own, err := s.startWatch(lockKey(name, s.id), false, true)
		if err != nil {
			return nil, err
		}
		w := watches{own: own, follows: &follows{s: s}, name: name, shared: s.keeper}
		if s.keeper != nil {
			w.queue, err = s.keeper.queueWatch(name)
		} else {
			w.queue, err = s.startWatch(name+"/", true, true)
		}
		if err != nil {
			own.stop()
			return nil, err
		}
		g = &gate{ch: make(chan struct{}, 1), w: w}
		g.drop = func() { gs.expire(name, g) }
		gs.m[name] = g
	}
	g.join()
	return g, nil
}

// leave counts a caller out. When nobody uses the gate, it is dropped, and
// its watch stopped, after idleWatch unless a caller comes first.
func (gs *gates) leave(name string, g *gate) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g.lingering.leave()
}

// expire drops an idle gate and stops its watches.
func (gs *gates) expire(name string, g *gate) {
	gs.mu.Lock()
	if g.inUse() || gs.m[name] != g {
		gs.mu.Unlock()
		return
	}
	delete(gs.m, name)
	gs.mu.Unlock()
	g.w.stop()
}

// closeAll stops the idle timers and gives back the Keeper's shared
// watches, as the session closes: its own watches stop with it.
func (gs *gates) closeAll() {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for name, g := range gs.m {
		g.stop()
		if g.w.shared != nil {
			g.w.shared.releaseQueue(name, g.w.queue)
		}
		delete(gs.m, name)
	}
}
