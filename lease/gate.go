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
// holding or waiting for it, so that an idle gate is dropped.
type gate struct {
	ch   chan struct{}
	refs int
}

// enter takes the gate of name, waiting for it unless try is set, until ctx
// or the session (ended) ends. The returned function gives it back.
func (gs *gates) enter(ctx context.Context, ended context.Context, name string, try bool) (func(), error) {
	g := gs.join(name)
	release := func() {
		<-g.ch
		gs.leave(name, g)
	}
	if try {
		select {
		case g.ch <- struct{}{}:
			return release, nil
		default:
			gs.leave(name, g)
			return nil, fmt.Errorf("%w: held or awaited through this same session", ErrLocked)
		}
	}
	select {
	case g.ch <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		gs.leave(name, g)
		return nil, ctx.Err()
	case <-ended.Done():
		gs.leave(name, g)
		return nil, context.Cause(ended)
	}
}

// join counts a caller in on name's gate, making it if needed.
func (gs *gates) join(name string) *gate {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.m == nil {
		gs.m = make(map[string]*gate)
	}
	g := gs.m[name]
	if g == nil {
		g = &gate{ch: make(chan struct{}, 1)}
		gs.m[name] = g
	}
	g.refs++
	return g
}

// leave counts a caller out, dropping the gate when nobody uses it.
func (gs *gates) leave(name string, g *gate) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g.refs--; g.refs == 0 {
		delete(gs.m, name)
	}
}
