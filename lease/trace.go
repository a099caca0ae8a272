package lease

import (
	"context"
	"time"
)

// Call describes a Lock, RLock, TryLock, TryRLock or Campaign call to
// Hooks.Call.
type Call struct {
	Op   string // "Lock", "RLock", "TryLock", "TryRLock" or "Campaign"
	Name string // the lock or election name
	Mode Mode   // Read for RLock and TryRLock, Write otherwise
}

// CallHooks hear one acquiring call and the holding it takes, for tracing
// (see package fence/fenceotel). Every field is optional; each is called
// at most once, except Release, called for every Unlock or Resign. They
// must be safe for concurrent use and quick, and never call back into the
// session.
type CallHooks struct {
	// Queued is called when the call's key is in the queue, before it
	// waits, with how many keys ahead of it keep it from being held: 0 for
	// a call granted at once. A long queue is counted from the first read
	// of it only, so with many keys ahead the count may be short.
	// Not called for a call that failed before its key was put, nor for a
	// TryLock or TryRLock refused without putting it.
	Queued func(ahead int)
	// Done is called as the call returns, with the token granted (0 if
	// none) and the error it returns.
	Done func(token int64, err error)
	// Release is called as each Unlock or Resign ("Unlock", "Resign") of
	// the holding starts, with its context, also one that finds the
	// holding ended already; it returns the context the call goes on
	// with, under the same rule as Hooks.Call, and the hooks whose Done
	// hears how it returned (with the holding's token). Called for a
	// granted holding only.
	Release func(ctx context.Context, op string) (context.Context, *CallHooks)
	// Ended is called once when the holding ends, with how long it was
	// held and why (see Cause). For a holding released by Unlock or
	// Resign it is called before that call returns (and before the
	// release's Done). A holding lost at once may end before the
	// acquiring call's Done. Called for a granted holding only, on
	// whichever goroutine sees the end.
	Ended func(held time.Duration, why error)
}

// call starts the tracing of an acquiring call: the context it goes on
// with and its hooks (nil for none).
func (h *Hooks) call(ctx context.Context, c Call) (context.Context, *CallHooks) {
	if h.Call == nil {
		return ctx, nil
	}
	cctx, ch := h.Call(ctx, c)
	if cctx == nil {
		cctx = ctx
	}
	return cctx, ch
}

func (ch *CallHooks) done(token int64, err error) {
	if ch != nil && ch.Done != nil {
		ch.Done(token, err)
	}
}

func (ch *CallHooks) ended(held time.Duration, why error) {
	if ch != nil && ch.Ended != nil {
		ch.Ended(held, why)
	}
}
