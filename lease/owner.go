package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// MaxOwnerLen bounds an owner given to WithOwner, in bytes.
const MaxOwnerLen = 256

// OwnerKeyPrefix starts the key of every session's owner record: the
// prefix, then the session's lease ID in lowercase hex, attached to that
// lease. The key has no "/", so it is never a place in any lock's queue,
// for this package or for etcd's own lock and election.
const OwnerKeyPrefix = "leasefence.owner."

// OwnerKey is the key of the owner record of the session whose lease is
// id.
func OwnerKey(id clientv3.LeaseID) string { return fmt.Sprintf("%s%x", OwnerKeyPrefix, int64(id)) }

// WithOwner names the session's holder for operators: Inspect reports it
// with every queue entry of the session (locks, read locks and
// candidacies alike) and lockctl prints it. It is recorded once per
// session, in a key of its own attached to the session's lease, so it
// costs no lock anything and goes when the lease goes; the lock keys and
// their values are those of etcd's own lock and election. Without
// WithOwner a session records the host name and process ID
// ("host/4242"), and carries on without a record if etcd refuses it (a
// role that may not write there, say), with a warning; a session given
// WithOwner fails instead. The owner is at most MaxOwnerLen bytes of
// printable UTF-8, and not empty.
func WithOwner(owner string) Option {
	return func(o *options) error {
		if err := checkOwner(owner); err != nil {
			return fmt.Errorf("%w: owner %w", ErrInvalidArgument, err)
		}
		o.owner, o.ownerGiven = owner, true
		return nil
	}
}

func checkOwner(owner string) error {
	switch {
	case owner == "":
		return errors.New("is empty")
	case len(owner) > MaxOwnerLen:
		return fmt.Errorf("is longer than %d bytes", MaxOwnerLen)
	case !utf8.ValidString(owner):
		return errors.New("is not UTF-8")
	}
	for _, r := range owner {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%q has a non-printing character", owner)
		}
	}
	return nil
}

// defaultOwner is the owner of a session given none: host name and
// process ID, what an operator matches against a process list.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// recordOwner writes the session's owner record. Only an owner the caller
// gave is worth failing the session for.
func (s *Session) recordOwner(ctx context.Context, o options) error {
	owner := o.owner
	if !o.ownerGiven {
		owner = defaultOwner()
	}
	_, err := s.client.Put(ctx, OwnerKey(s.id), owner, clientv3.WithLease(s.id))
	switch {
	case err == nil:
		s.owner = owner
		return nil
	case o.ownerGiven || errors.Is(err, rpctypes.ErrLeaseNotFound) || ctx.Err() != nil:
		return fmt.Errorf("record owner: %w", err)
	}
	s.lg.Warn("owner not recorded: Inspect and lockctl will show none for this session",
		zap.String("key", OwnerKey(s.id)), zap.Error(err))
	return nil
}

// Owner is the holder's identity the session recorded (WithOwner, or the
// default), or empty if it recorded none.
func (s *Session) Owner() string { return s.owner }

// readOwner reads the owner record of lease id; empty if there is none.
func readOwner(ctx context.Context, client *clientv3.Client, id clientv3.LeaseID) (string, error) {
	resp, err := client.Get(ctx, OwnerKey(id))
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	// A record attached to another lease was not written by that
	// session: it does not name its owner.
	if clientv3.LeaseID(resp.Kvs[0].Lease) != id {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
