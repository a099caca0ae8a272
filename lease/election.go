package lease

import (
	"context"
	"fmt"
)

// Leadership is a won election: a Lock whose key carries the leader's
// value, which observers read. Its methods are safe for concurrent use.
// It ends, and shows it, as a Lock does. Being leader is never proof at
// the moment of a write: fence the writes with Token.
type Leadership struct{ l *Lock }

// Campaign waits until this session leads the election name, then returns
// the Leadership with value as the leader's value. It takes turns with
// concurrency.Election, etcd's Election RPC, etcdctl elect and candidates
// on the same session; to etcd a lock and an election of one name are the
// same thing. On failure its key is removed before it returns, as for
// Lock; a candidate whose key or session vanishes while waiting returns at
// once with an error wrapping ErrLost or ErrSessionClosed. ReaderValue is
// no leader's value (its key would read as a reader's, and readers would
// share the name with the leader): it is refused with an error wrapping
// ErrInvalidArgument before anything is sent.
func (s *Session) Campaign(ctx context.Context, name, value string) (*Leadership, error) {
	if err := leaderValue(value); err != nil {
		return nil, failed(fmt.Sprintf("campaign %q", name), err)
	}
	l, err := s.acquire(ctx, Call{Op: "Campaign", Name: name, Mode: Write}, value, false, nil)
	if err != nil {
		return nil, err
	}
	return &Leadership{l: l}, nil
}

// Name is the election's name.
func (e *Leadership) Name() string { return e.l.t.name() }

// Key is the leader's etcd key: Name() + "/" + the lease ID in hex.
func (e *Leadership) Key() string { return e.l.t.key }

// Token is the leadership's fencing token, which Proclaim does not change.
// Later leaders of the same name have larger tokens.
func (e *Leadership) Token() int64 { return e.l.Token() }

// Value is the value last proclaimed (or given to Campaign).
func (e *Leadership) Value() string { return e.l.currentValue() }

// Done is closed when the leadership ends, as a Lock's Done.
func (e *Leadership) Done() <-chan struct{} { return e.l.Done() }

// Err is nil while leading; after Done is closed it says why, as Lock.Err
// does (ErrUnlocked after Resign).
func (e *Leadership) Err() error { return e.l.Err() }

// Context returns a context derived from parent that is also cancelled when
// the leadership ends, with Err as its cause.
func (e *Leadership) Context(parent context.Context) (context.Context, context.CancelFunc) {
	return e.l.Context(parent)
}

// WriteContext is Lock.WriteContext: it does not end with the leadership.
func (e *Leadership) WriteContext(parent context.Context) (context.Context, context.CancelFunc) {
	return e.l.WriteContext(parent)
}

// Lock returns the lock underneath, for APIs that take a *Lock.
func (e *Leadership) Lock() *Lock { return e.l }

// Proclaim sets the leader's value without giving up the lead; it never
// creates a key or touches a successor's. After the leadership ended it
// sends nothing and says how; a key found gone ends the leadership with
// ErrKeyDeleted. If etcd did not answer, the value may or may not be set.
// ReaderValue is refused, as by Campaign, with an error wrapping
// ErrInvalidArgument: nothing is sent, and the leadership keeps its value
// and its lead.
func (e *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := leaderValue(value); err != nil {
		return failed(fmt.Sprintf("proclaim %q", e.l.t.name()), err)
	}
	if err := e.l.put(ctx, value); err != nil {
		return failed(fmt.Sprintf("proclaim %q", e.l.t.name()), err)
	}
	return nil
}

// Resign gives up the lead, with a delete guarded like Unlock's; the next
// candidate in line becomes leader. It behaves as Lock.Unlock on failure.
func (e *Leadership) Resign(ctx context.Context) error {
	ctx, done := e.l.traceRelease(ctx, "Resign")
	err := e.l.unlock(ctx)
	if err != nil {
		err = failed(fmt.Sprintf("resign %q", e.l.t.name()), err)
	}
	done(err)
	return err
}

// leaderValue refuses ReaderValue as a leader's value: a key with that
// value is a reader's to every lock of the name, so a read lock would be
// granted beside the leader.
func leaderValue(value string) error {
	if value == ReaderValue {
		return fmt.Errorf("%w: %q is the value of a reader's key, not a leader's", ErrInvalidArgument, value)
	}
	return nil
}
