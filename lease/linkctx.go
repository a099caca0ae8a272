package lease

import "context"

// linkCause returns a child of parent also cancelled, with ender's cause,
// when ender ends, so that work bound to a session says why it stopped
// (a lock's is bound by its ending's link). stop releases the link and cancels the child.
func linkCause(parent, ender context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	// Cancel now if ender has ended: AfterFunc would do it a moment later.
	if ender.Err() != nil {
		cancel(context.Cause(ender))
	}
	unlink := context.AfterFunc(ender, func() { cancel(context.Cause(ender)) })
	return ctx, func() {
		unlink()
		cancel(context.Canceled)
	}
}
