package lease

import "time"

// lingering counts the users of something kept for them in a map (a
// name's gate, a Keeper's shared queue watch), and drops it idleWatch
// after the last one leaves, unless another comes first: a lock taken
// again and again keeps its watches open. The owner's mutex guards it.
type lingering struct {
	users int
	idle  *time.Timer // set while users is 0: drops the thing when it fires
}

// join counts a user in, keeping the thing from being dropped.
func (l *lingering) join() {
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	l.users++
}

// leave counts a user out; after the last, drop runs in idleWatch. drop
// takes the owner's mutex and checks inUse first: a user may have joined
// as the timer fired.
func (l *lingering) leave(drop func()) {
	if l.users--; l.users == 0 {
		l.idle = time.AfterFunc(idleWatch, drop)
	}
}

// inUse tells whether a user has joined since the last left.
func (l *lingering) inUse() bool { return l.users > 0 }

// stop stops a pending drop, as the owner closes.
func (l *lingering) stop() {
	if l.idle != nil {
		l.idle.Stop()
	}
}
