package lease

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Match them with errors.Is: the errors this package
// returns wrap them with context.
var (
	// ErrLocked is returned by TryLock when another holder has the lock.
	ErrLocked = errors.New("lease: locked by another holder")

	// ErrLost is wrapped by every error that reports an involuntary end of
	// ownership: the lease expired, or the lock key was deleted or replaced.
	// A lost lock may already belong to someone else.
	ErrLost = errors.New("lease: lock lost")

	// ErrLeaseExpired reports that the session's lease ended without the
	// session closing it: etcd said it was gone, or it was not renewed before
	// the library's conservative deadline. It wraps ErrLost.
	ErrLeaseExpired = fmt.Errorf("%w: lease expired", ErrLost)

	// ErrKeyDeleted reports that the lock's key was deleted or replaced by
	// someone other than this lock. It wraps ErrLost.
	ErrKeyDeleted = fmt.Errorf("%w: lock key deleted or replaced", ErrLost)

	// ErrUnlocked is the Err of a lock that Unlock released, and the error of
	// a second Unlock.
	ErrUnlocked = errors.New("lease: lock released")

	// ErrSessionClosed is the Err of a session ended by Close, of the locks it
	// held, and the error of calls on a closed session.
	ErrSessionClosed = errors.New("lease: session closed")

	// ErrInvalidArgument is wrapped by errors for bad input (an empty lock
	// name, a nil client, a TTL under one second), returned before anything
	// is sent to etcd.
	ErrInvalidArgument = errors.New("lease: invalid argument")

	// ErrKeyInUse reports that the key this session would use for a lock
	// already exists without being this library's: another client shares the
	// session's lease (for example a concurrency.Mutex built on it). Taking
	// the lock would make two holders, so the library refuses.
	ErrKeyInUse = errors.New("lease: lock key already in use on this lease")

	// ErrRevisionRegressed reports that etcd's store revision went
	// backwards under a live session: etcd was restored from a snapshot
	// without bumping the revision (etcdutl snapshot restore
	// --bump-revision N --mark-compacted), so tokens can repeat and fences
	// can no longer tell old holders from new ones. It wraps ErrLost.
	ErrRevisionRegressed = fmt.Errorf("%w: store revision went backwards", ErrLost)

	// ErrNoLeader is returned by CurrentLeader when nobody holds the
	// election.
	ErrNoLeader = errors.New("lease: no leader")

	// ErrTLSHandshake reports that NewSession could not reach etcd because
	// the TLS handshake failed for a certificate reason: the server's
	// certificate is not trusted, or the client's is missing or refused.
	// Retrying does not help; the error carries the reason.
	ErrTLSHandshake = errors.New("lease: tls handshake failed")

	// ErrObserverClosed is the Err of an Observer stopped by Close.
	ErrObserverClosed = errors.New("lease: observer closed")
)

// errNilClient is the error for a nil *clientv3.Client.
var errNilClient = fmt.Errorf("%w: nil etcd client", ErrInvalidArgument)

// opError is the error of one call of the package: "lease: <op>: <cause>",
// with the cause's own "lease: " dropped so that the package is named
// once. It unwraps to the cause.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "lease: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "lease: ")
}

func (e *opError) Unwrap() error { return e.err }

// failed wraps err as the error of op.
func failed(op string, err error) error { return &opError{op: op, err: err} }
