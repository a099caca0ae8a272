package lease

import (
	"context"
	"fmt"
	"sync"
	"time"
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
// holding or waiting for it. It also keeps the name's queue watch, which
// outlives the last caller by idleWatch before the gate is dropped.
type gate struct {
	ch    chan struct{}
	refs  int
	watch *queueWatch
	idle  *time.Timer // set while refs is 0: drops the gate when it fires
}

// enter takes the gate of name, waiting for it unless try is set, until ctx
// or the session ends. It returns the name's queue watch, started if need
// be, and a function that gives the gate back.
func (gs *gates) enter(ctx context.Context, s *Session, name string, try bool) (*queueWatch, func(), error) {
	g, err := gs.join(s, name)
	if err != nil {
		return nil, nil, err
	}
	release := func() {
		<-g.ch
		gs.leave(name, g)
	}
	if try {
		select {
		case g.ch <- struct{}{}:
			return g.watch, release, nil
		default:
			gs.leave(name, g)
			return nil, nil, fmt.Errorf("%w: held or awaited through this same session", ErrLocked)
		}
	}
	select {
	case g.ch <- struct{}{}:
		return g.watch, release, nil
	case <-ctx.Done():
		gs.leave(name, g)
		return nil, nil, ctx.Err()
	case <-s.ctx.Done():
		gs.leave(name, g)
		return nil, nil, context.Cause(s.ctx)
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
		w, err := s.startQueueWatch(name)
		if err != nil {
			return nil, err
		}
		g = &gate{ch: make(chan struct{}, 1), watch: w}
		gs.m[name] = g
	}
	if g.idle != nil {
		g.idle.Stop()
		g.idle = nil
	}
	g.refs++
	return g, nil
}

// leave counts a caller out. When nobody uses the gate, it is dropped, and
// its watch stopped, after idleWatch unless a caller comes first.
func (gs *gates) leave(name string, g *gate) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g.refs--; g.refs == 0 {
		g.idle = time.AfterFunc(idleWatch, func() { gs.expire(name, g) })
	}
}

// expire drops an idle gate and stops its watch.
func (gs *gates) expire(name string, g *gate) {
	gs.mu.Lock()
	if g.refs > 0 || gs.m[name] != g {
		gs.mu.Unlock()
		return
	}
	delete(gs.m, name)
	gs.mu.Unlock()
	g.watch.stop()
}

// stopIdle stops the idle timers, as the session closes: its watches stop
// with it.
func (gs *gates) stopIdle() {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, g := range gs.m {
		if g.idle != nil {
			g.idle.Stop()
		}
	}
}
