package lease

import "context"

// linkCause returns a child of parent that is also cancelled when ender
// ends, with ender's cause (context.Cause), so that work bound to a lock
// or a session says why it stopped. stop releases the link and cancels the
// child.
func linkCause(parent, ender context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	// AfterFunc runs its func on a goroutine of its own even when ender
	// has ended already: the child would look alive for a moment after
	// the call. Ended is ended at once.
	if ender.Err() != nil {
		cancel(context.Cause(ender))
	}
	unlink := context.AfterFunc(ender, func() { cancel(context.Cause(ender)) })
	return ctx, func() {
		unlink()
		cancel(context.Canceled)
	}
}
