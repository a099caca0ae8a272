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
	// grantKeepsUnlistened keeps trusting a subscription the lock ended
	// (issue 35, bug 1 with its fix reverted: a waiter that joined the
	// Keeper's copy still counted the shared watch it no longer heard as
	// up, and hung once that watch paused).
	grantKeepsUnlistened
)

func (s grantSeam) ignoresStart() bool    { return s.mutation == grantIgnoresStart }
func (s grantSeam) ignoresOwn() bool      { return s.mutation == grantIgnoresOwn }
func (s grantSeam) keepsUnlistened() bool { return s.mutation == grantKeepsUnlistened }
