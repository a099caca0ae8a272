package fence

import (
	"errors"
	"fmt"

	"github.com/leasefence/leasefence/internal/rpcerr"
)

// Sentinel errors; match them with errors.Is.
var (
	// ErrNotHeld reports that a Held guard failed: the lock key is gone,
	// was created anew (a different token), or was moved off the lease
	// its name encodes. The error is a *NotHeldError.
	ErrNotHeld = errors.New("fence: lock not held")

	// ErrStale reports that a Resource guard failed: the resource has
	// accepted a higher token. The error is a *StaleError.
	ErrStale = errors.New("fence: stale token")

	// ErrOutcomeUnknown reports that a request may have reached etcd but no
	// answer came back: the write may or may not have been applied. It is
	// never retried automatically; read back before trying again.
	ErrOutcomeUnknown = errors.New("fence: outcome unknown")

	// ErrInvalidArgument is wrapped by errors for bad input, returned before
	// anything is sent.
	ErrInvalidArgument = errors.New("fence: invalid argument")

	// ErrBadRecord reports a fence record whose value is not a token
	// written by EncodeToken: something other than this package wrote it.
	ErrBadRecord = errors.New("fence: bad token record")

	// ErrUnverified reports a token that etcd did not confirm as the live
	// holder's of the lock it was offered for: no lock key of that name
	// with that creation revision exists on the lease its name encodes, or
	// it waits behind an older one. The error is an *UnverifiedError. Unlike a stale token, it says
	// nothing about the order of tokens, and it raises nothing.
	ErrUnverified = errors.New("fence: unverified token")
)

// NotHeldError is the error of a failed Held guard, or of a holder whose
// Err was already set, so that nothing was sent.
type NotHeldError struct {
	Key   string // the lock key
	Token int64  // the token the guard expected
	// Current is the creation revision etcd found the key with, 0 if it
	// was gone (or, with Cause set, not read).
	Current int64
	// Cause is the holder's own Err when it had already ended and nothing
	// was sent; nil when etcd refused the guard.
	Cause error
	// Detached: the key still has the token, but someone else's put
	// moved it off the lease its name encodes (onto no lease or another
	// one), so it no longer goes with the holder.
	Detached bool
}

func (e *NotHeldError) Error() string {
	switch {
	case e.Cause != nil:
		return fmt.Sprintf("fence: lock not held: %q (token %d) has ended: %v", e.Key, e.Token, e.Cause)
	case e.Current == 0:
		return fmt.Sprintf("fence: lock not held: key %q (token %d) is gone", e.Key, e.Token)
	case e.Detached:
		return fmt.Sprintf("fence: lock not held: key %q (token %d) is no longer attached to the lease its name encodes", e.Key, e.Token)
	}
	return fmt.Sprintf("fence: lock not held: key %q has token %d, not %d", e.Key, e.Current, e.Token)
}

// Is makes errors.Is(err, ErrNotHeld) hold.
func (e *NotHeldError) Is(target error) bool { return target == ErrNotHeld }

// Unwrap returns Cause, so that errors.Is also matches the holder's reason
// (lease.ErrLost, lease.ErrUnlocked, ...).
func (e *NotHeldError) Unwrap() error { return e.Cause }

// StaleError is the error of a failed Resource guard.
type StaleError struct {
	Key     string // the fence record key; the lock name for fencehttp and fencegrpc
	Token   int64  // the token offered
	Highest int64  // the highest token the record had accepted
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale token %d at %q: token %d already accepted", e.Token, e.Key, e.Highest)
}

// Is makes errors.Is(err, ErrStale) hold.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// UnverifiedError is the refusal of a token that etcd, asked at
// Revision, did not show as the live holder of lock Name.
type UnverifiedError struct {
	Name  string // the lock name the token was offered for
	Token int64  // the token offered
	// Revision is etcd's revision when it was asked. A Token above it is
	// no holding at all: etcd has not handed it out yet.
	Revision int64
	// Key is the lock key of Name with creation revision Token, if etcd
	// has one: Detached, someone's put moved it off the lease its name
	// encodes, or it waits behind Ahead, an older key of the queue (the
	// holder's, or one ahead of it). "" if there is no such key.
	Key      string
	Detached bool
	Ahead    string
}

func (e *UnverifiedError) Error() string {
	head := fmt.Sprintf("fence: unverified token %d for lock %q", e.Token, e.Name)
	switch {
	case e.Token > e.Revision:
		return fmt.Sprintf("%s: etcd is at revision %d, so no holding has that token", head, e.Revision)
	case e.Detached:
		return fmt.Sprintf("%s: key %q has it but is no longer on the lease its name encodes (etcd at revision %d)", head, e.Key, e.Revision)
	case e.Ahead != "":
		return fmt.Sprintf("%s: its key %q waits behind %q, not the holder yet (etcd at revision %d)", head, e.Key, e.Ahead, e.Revision)
	}
	return fmt.Sprintf("%s: etcd at revision %d has no lock key of that name with that creation revision", head, e.Revision)
}

// Is makes errors.Is(err, ErrUnverified) hold.
func (e *UnverifiedError) Is(target error) bool { return target == ErrUnverified }

// classify turns a failed request's error into one that says whether the
// request can have been applied. Only errors etcd returns before applying
// anything are definite; everything else (deadline, cancel, lost connection)
// may hide an applied write.
func classify(err error) error {
	if rpcerr.Definite(err) {
		return fmt.Errorf("fence: commit: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}
