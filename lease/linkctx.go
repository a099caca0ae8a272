package lease

import "context"

// linkCause returns a child of parent that is also cancelled when ender
// ends, with ender's cause (context.Cause), so that work bound to a lock
// or a session says why it stopped. stop releases the link and cancels the
// child.
func linkCause(parent, ender context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	unlink := context.AfterFunc(ender, func() { cancel(context.Cause(ender)) })
	return ctx, func() {
		unlink()
		cancel(context.Canceled)
	}
}
