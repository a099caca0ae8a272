package lease

import "time"

// lingering counts the users of something kept for them in a map (a
// name's gate, a Keeper's shared queue watch), and drops it idleWatch
// after the last one leaves, unless another comes first: a lock taken
// again and again keeps its watches open. The owner's mutex guards it.
type lingering struct {
	users int
	// drop drops the thing; it takes the owner's mutex and checks inUse
	// first: a user may have joined as the timer fired. Set once, as the
	// thing is made.
	drop func()
	// idle runs drop idleWatch after the last user left. It is made once
	// and reset on each last leave: a lock taken and released again and
	// again makes no timer each time.
	idle *time.Timer
}

// join counts a user in, keeping the thing from being dropped.
func (l *lingering) join() {
	if l.idle != nil {
		l.idle.Stop()
	}
	l.users++
}

// leave counts a user out; after the last, drop runs in idleWatch.
func (l *lingering) leave() {
	if l.users--; l.users != 0 {
		return
	}
	if l.idle == nil {
		l.idle = time.AfterFunc(idleWatch, l.drop)
		return
	}
	l.idle.Reset(idleWatch)
}

// inUse tells whether a user has joined since the last left.
func (l *lingering) inUse() bool { return l.users > 0 }

// stop stops a pending drop, as the owner closes.
func (l *lingering) stop() {
	if l.idle != nil {
		l.idle.Stop()
	}
}
