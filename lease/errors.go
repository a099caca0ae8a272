package lease

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors, for errors.Is: the package's errors wrap them.
var (
	// ErrLocked is returned by TryLock and TryRLock when another holder
	// blocks them.
	ErrLocked = errors.New("lease: locked by another holder")

	// ErrLost is wrapped by every error that reports an involuntary end of
	// ownership (lease expired, key deleted or replaced, store revision
	// gone backwards). A lost lock may already belong to someone else.
	ErrLost = errors.New("lease: lock lost")

	// ErrLeaseExpired reports that the lease ended without Close: etcd said
	// it was gone, or it was not renewed by Deadline. It wraps ErrLost.
	ErrLeaseExpired = fmt.Errorf("%w: lease expired", ErrLost)

	// ErrKeyDeleted reports that the lock's key was deleted or replaced by
	// someone other than this lock. It wraps ErrLost.
	ErrKeyDeleted = fmt.Errorf("%w: lock key deleted or replaced", ErrLost)

	// ErrUnlocked is the Err of a lock that Unlock released, and the error of
	// a second Unlock.
	ErrUnlocked = errors.New("lease: lock released")

	// ErrSessionClosed is the Err of a session ended by Close, of the locks it
	// held, and the error of calls on a closed session or Keeper.
	ErrSessionClosed = errors.New("lease: session closed")

	// ErrInvalidArgument is wrapped by errors for bad input, returned
	// before anything is sent to etcd.
	ErrInvalidArgument = errors.New("lease: invalid argument")

	// ErrKeyInUse reports that the session's key for a lock exists on its
	// lease but was not put by the session: another client (a
	// concurrency.Mutex, say) shares the lease, and taking the lock would
	// make two holders, so the lock is refused and the key left alone. A
	// key left at that path by someone else's put with no lease or another
	// one is no holding: the lock removes it and queues.
	ErrKeyInUse = errors.New("lease: lock key already in use on this lease")

	// ErrRevisionRegressed reports that etcd's store revision went
	// backwards under a live session, so tokens can repeat: a restore from
	// a snapshot without etcdutl's --bump-revision N --mark-compacted. It
	// wraps ErrLost.
	ErrRevisionRegressed = fmt.Errorf("%w: store revision went backwards", ErrLost)

	// ErrNoLeader is returned by CurrentLeader when nobody leads.
	ErrNoLeader = errors.New("lease: no leader")

	// ErrTLSHandshake reports that NewSession's TLS handshake failed for a
	// certificate reason (the server's certificate not trusted, the
	// client's missing or refused), which retrying does not fix.
	ErrTLSHandshake = errors.New("lease: tls handshake failed")

	// ErrObserverClosed is the Err of an Observer stopped by Close.
	ErrObserverClosed = errors.New("lease: observer closed")
)

var errNilClient = fmt.Errorf("%w: nil etcd client", ErrInvalidArgument)

// opError is "lease: <op>: <cause>", without the cause's own "lease: ",
// so that the package is named once. It unwraps to the cause.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "lease: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "lease: ")
}

func (e *opError) Unwrap() error { return e.err }

func failed(op string, err error) error { return &opError{op: op, err: err} }
