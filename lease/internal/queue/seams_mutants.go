//go:build leasefence_mutants

package queue

// grantSeam carries a deliberate bug in the grant rule, for the explorer
// to show that it catches it.
type grantSeam struct{ mutation grantMutation }

// grantMutation names a deliberate bug in the grant rule.
type grantMutation int

const (
	_ grantMutation = iota // the plain rule
	// grantIgnoresStart lets a watch vouch for revisions before it
	// started (the hang and the stale view of a read answered by a
	// lagging member).
	grantIgnoresStart
	// grantIgnoresOwn grants with no knowledge of the own key past the
	// snapshot (a far waiter granted after its own key went).
	grantIgnoresOwn
)

func (s grantSeam) ignoresStart() bool { return s.mutation == grantIgnoresStart }
func (s grantSeam) ignoresOwn() bool   { return s.mutation == grantIgnoresOwn }

// waiterSeam carries a deliberate bug in a waiter's handling of its
// subscriptions, for the explorer to show that it catches it.
type waiterSeam struct{ mutation waiterMutation }

// waiterMutation names a deliberate bug in a waiter.
type waiterMutation int

const (
	_ waiterMutation = iota // the plain waiter
	// waiterJoinKeepsTrust ends the subscription to the queue watch's
	// events as the lock joins the copy without telling the rule (bug 1
	// of issue 35, where it was: a waiter that joined the Keeper's copy
	// still counted the shared watch it no longer heard as up, and hung
	// once that watch paused).
	waiterJoinKeepsTrust
	// waiterDropsRefollow never sees that a key a far waiter follows
	// went: it keeps waiting on the follow watches it has.
	waiterDropsRefollow
	// waiterKeepsFar never clears far as a far waiter reads its view
	// again: it follows to the end, however few are ahead.
	waiterKeepsFar
	// waiterSkipsConfirmOwn reads on without confirming the own key after
	// the own-key watch was down since the view was read.
	waiterSkipsConfirmOwn
	// waiterJoinNeverRefuses has JoinCopy report joined whatever became of
	// the watch's epoch and the copy while the lock registered with it.
	waiterJoinNeverRefuses
	// waiterJoinIgnoresEpoch has JoinCopy take the copy of the lock's
	// epoch though the watch has left that epoch (its down not yet told,
	// the copy not yet dropped).
	waiterJoinIgnoresEpoch
	// waiterLeaveKeepsMirrored has LeaveCopy leave the lock marked as
	// waiting on the copy: each look then takes the copy, and each read
	// restarts the queue subscription.
	waiterLeaveKeepsMirrored
	// waiterJoinUpsFirstEpoch has JoinCopy record the subscription via the
	// copy as up in epoch 1, whatever epoch the lock joined in.
	waiterJoinUpsFirstEpoch
)

func (s waiterSeam) joinKeepsTrust() bool  { return s.mutation == waiterJoinKeepsTrust }
func (s waiterSeam) dropsRefollow() bool   { return s.mutation == waiterDropsRefollow }
func (s waiterSeam) keepsFar() bool        { return s.mutation == waiterKeepsFar }
func (s waiterSeam) skipsConfirmOwn() bool { return s.mutation == waiterSkipsConfirmOwn }

func (s waiterSeam) joinNeverRefuses() bool   { return s.mutation == waiterJoinNeverRefuses }
func (s waiterSeam) joinIgnoresEpoch() bool   { return s.mutation == waiterJoinIgnoresEpoch }
func (s waiterSeam) leaveKeepsMirrored() bool { return s.mutation == waiterLeaveKeepsMirrored }

func (s waiterSeam) copyEpoch(epoch Epoch) Epoch {
	if s.mutation == waiterJoinUpsFirstEpoch {
		return 1
	}
	return epoch
}

// copySeam carries a deliberate bug in a Keeper's copy, for the explorer
// to show that it catches it.
type copySeam struct{ mutation copyMutation }

// copyMutation names a deliberate bug in a copy.
type copyMutation int

const (
	_ copyMutation = iota // the plain copy
	// copyMissesHead never wakes the waiter of the oldest key as a
	// deletion makes it the head: the copy's statement of who may hold
	// the lock goes wrong, and that waiter sleeps on a free lock.
	copyMissesHead
)

func (s copySeam) missesHead() bool { return s.mutation == copyMissesHead }
