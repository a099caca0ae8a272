package lease

import (
	"context"
	"fmt"
)

// Leadership is a won election: a Lock whose key carries a value, the
// leader's, that observers read. Its methods are safe for concurrent use.
//
// It ends the way a Lock ends, and shows it the same way: Done is closed,
// Err says why (wrapping ErrLost for an involuntary loss), and contexts from
// Context are cancelled. As with a Lock, being leader is never proof at the
// moment of a write: fence the writes with Token.
type Leadership struct{ l *Lock }

// Campaign waits until this session leads the election name, then returns
// the Leadership with value as the leader's value. It uses etcd's own key
// layout (name + "/" + the lease ID in hex, the oldest key leads), so it
// takes turns with concurrency.Election, etcd's Election RPC and etcdctl
// elect. Candidates on one session take turns too.
//
// A lock and an election with the same name are the same thing to etcd:
// keep their names apart.
//
// On failure the candidate's key is removed before Campaign returns, as for
// Lock. A candidate whose key or session vanishes while waiting returns at
// once with an error wrapping ErrLost or ErrSessionClosed; it never becomes
// leader.
func (s *Session) Campaign(ctx context.Context, name, value string) (*Leadership, error) {
	l, err := s.acquire(ctx, name, Write, value, false)
	if err != nil {
		return nil, failed(fmt.Sprintf("campaign %q", name), err)
	}
	return &Leadership{l: l}, nil
}

// Name is the election's name.
func (e *Leadership) Name() string { return e.l.name }

// Key is the leader's etcd key: Name() + "/" + the lease ID in hex.
func (e *Leadership) Key() string { return e.l.key }

// Token is the fencing token of this leadership: the creation revision of
// its key. Later leaders of the same name have larger tokens. Proclaim does
// not change it.
func (e *Leadership) Token() int64 { return e.l.Token() }

// Value is the value last proclaimed (or given to Campaign).
func (e *Leadership) Value() string { return e.l.currentValue() }

// Done is closed when the leadership ends: Resign, Close of the session,
// expiry of the lease, or deletion or replacement of the key.
func (e *Leadership) Done() <-chan struct{} { return e.l.Done() }

// Err is nil while leading; after Done is closed it says why, as Lock.Err
// does (ErrUnlocked after Resign).
func (e *Leadership) Err() error { return e.l.Err() }

// Context returns a context derived from parent that is also cancelled when
// the leadership ends, with Err as its cause.
func (e *Leadership) Context(parent context.Context) (context.Context, context.CancelFunc) {
	return e.l.Context(parent)
}

// WriteContext is Lock.WriteContext: a context for a fenced write that
// does not end with the leadership.
func (e *Leadership) WriteContext(parent context.Context) (context.Context, context.CancelFunc) {
	return e.l.WriteContext(parent)
}

// Lock returns the lock underneath, for APIs that take a *Lock.
func (e *Leadership) Lock() *Lock { return e.l }

// Proclaim sets the leader's value without giving up the lead. The write is
// guarded by the key's creation revision: it never creates a key, and never
// touches a successor's. If the leadership has already ended, nothing is
// sent and the error says how. If the key is found gone, the leadership ends
// with an error wrapping ErrKeyDeleted. If etcd did not answer, the value may
// or may not have been set; the leadership goes on.
func (e *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := e.l.put(ctx, value); err != nil {
		return failed(fmt.Sprintf("proclaim %q", e.l.name), err)
	}
	return nil
}

// Resign gives up the lead, with a delete guarded like Unlock's; the next
// candidate in line becomes leader. It behaves as Lock.Unlock on failure.
func (e *Leadership) Resign(ctx context.Context) error {
	if err := e.l.unlock(ctx); err != nil {
		return failed(fmt.Sprintf("resign %q", e.l.name), err)
	}
	return nil
}
