package lease

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// ending is an end that comes once, with a cause: how a lock ends
// (Lock.Err), and then that it has finished (Lock.Done). It does for a
// lock what a context made with context.WithCancelCause from the
// session's did, at a fraction of the memory, which counts when a process
// holds many locks:
//   - it hangs off no parent: the session ends each of its locks itself
//     (Session.endLocks), with its own cause;
//   - it makes its channel only for the first to wait on it (done), which
//     a lock granted at once never does;
//   - it keeps the contexts bound to the lock (link) only while they are.
type ending struct {
	cause atomic.Pointer[error] // nil until ended
	mu    sync.Mutex
	ch    chan struct{} // made by the first done; closed as it ends
	links *[]*endLink   // contexts bound to the lock, to cancel as it ends
}

// endLink is one context bound to the lock.
type endLink struct{ cancel context.CancelCauseFunc }

// end ends the lock with cause (context.Canceled for nil), unless it has
// ended already.
func (e *ending) end(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	e.mu.Lock()
	if e.cause.Load() != nil {
		e.mu.Unlock()
		return
	}
	e.cause.Store(&cause)
	if e.ch != nil {
		close(e.ch)
	}
	var links []*endLink
	if e.links != nil {
		links, e.links = *e.links, nil
	}
	e.mu.Unlock()
	for _, l := range links {
		l.cancel(cause)
	}
}

// err is why the lock ended; nil while it has not.
func (e *ending) err() error {
	if p := e.cause.Load(); p != nil {
		return *p
	}
	return nil
}

// done is closed once the lock has ended.
func (e *ending) done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch == nil {
		e.ch = make(chan struct{})
		if e.cause.Load() != nil {
			close(e.ch)
		}
	}
	return e.ch
}

// link returns a child of parent, also cancelled with the lock's cause
// as it ends. stop releases the link and cancels the child.
func (e *ending) link(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	l := &endLink{cancel: cancel}
	e.mu.Lock()
	if p := e.cause.Load(); p != nil {
		e.mu.Unlock()
		cancel(*p)
		return ctx, func() { cancel(context.Canceled) }
	}
	if e.links == nil {
		e.links = new([]*endLink)
	}
	*e.links = append(*e.links, l)
	e.mu.Unlock()
	return ctx, func() {
		e.mu.Lock()
		if e.links != nil {
			*e.links = slices.DeleteFunc(*e.links, func(x *endLink) bool { return x == l })
			if len(*e.links) == 0 {
				e.links = nil
			}
		}
		e.mu.Unlock()
		cancel(context.Canceled)
	}
}
