package lease

import (
	"sync"
	"sync/atomic"
	"time"
)

// registry keeps one entry per lock name for the users that share it (a
// session's locks share its gate, a Keeper's sessions its queue watch),
// and drops an entry idleWatch after the last user leaves, unless another
// comes first.
type registry[V any] struct {
	open func(name string) (V, error) // makes a name's entry; runs with mu held
	shut func(V)                      // ends a dropped entry; runs without mu

	mu     sync.Mutex
	m      map[string]*entry[V]
	closed bool
}

type entry[V any] struct {
	v     V
	name  string
	users int
	idle  *time.Timer // made at the first last-leave, then reset: no timer per lock
}

// join counts a user in on name's entry, made if needed, and returns it
// and a function that counts the user out once; after close it fails.
func (r *registry[V]) join(name string) (V, func(), error) {
	e, err := r.enter(name)
	if err != nil {
		var zero V
		return zero, nil, err
	}
	lv := &leaver[V]{r: r, e: e}
	return e.v, lv.leave, nil
}

// enter is join for a user that counts itself out exactly once (exit),
// and so needs no function to do it once: a lock, which keeps the entry
// while held.
func (r *registry[V]) enter(name string) (*entry[V], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrSessionClosed
	}
	e := r.m[name]
	if e == nil {
		v, err := r.open(name)
		if err != nil {
			return nil, err
		}
		if r.m == nil {
			r.m = make(map[string]*entry[V])
		}
		e = &entry[V]{v: v, name: name}
		r.m[name] = e
	}
	if e.idle != nil {
		e.idle.Stop()
	}
	e.users++
	return e, nil
}

// leaver counts one user out of an entry, once (smaller than a
// sync.OnceFunc, of which a session holding many names keeps one each).
type leaver[V any] struct {
	r    *registry[V]
	e    *entry[V]
	done atomic.Bool
}

func (lv *leaver[V]) leave() {
	if lv.done.CompareAndSwap(false, true) {
		lv.r.exit(lv.e)
	}
}

// exit counts one user out of e, which enter or join counted in.
func (r *registry[V]) exit(e *entry[V]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.users--; e.users > 0 || r.closed {
		return
	}
	if e.idle == nil {
		e.idle = time.AfterFunc(idleWatch, func() { r.expire(e.name, e) })
		return
	}
	e.idle.Reset(idleWatch)
}

// expire drops an entry left idle, unless a user joined as the timer
// fired or the entry was replaced.
func (r *registry[V]) expire(name string, e *entry[V]) {
	r.mu.Lock()
	if e.users > 0 || r.m[name] != e {
		r.mu.Unlock()
		return
	}
	delete(r.m, name)
	r.mu.Unlock()
	r.shut(e.v)
}

// close drops every entry, in use or not, and refuses new users.
func (r *registry[V]) close() {
	r.mu.Lock()
	m := r.m
	r.m, r.closed = nil, true
	for _, e := range m {
		if e.idle != nil {
			e.idle.Stop()
		}
	}
	r.mu.Unlock()
	for _, e := range m {
		r.shut(e.v)
	}
}
