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

// OwnerKeyPrefix, then the lease ID in lowercase hex, is the key of a
// session's owner record. It has no "/", so it is never a place in a queue.
const OwnerKeyPrefix = "leasefence.owner."

// OwnerKey is the key of the owner record of the session with lease id.
func OwnerKey(id clientv3.LeaseID) string { return fmt.Sprintf("%s%x", OwnerKeyPrefix, int64(id)) }

// WithOwner names the session's holder for operators: Inspect and lockctl
// show it with the session's queue entries. It is recorded once, under
// OwnerKey with the session's lease. Without WithOwner a session records
// "host/pid", and goes on without a record, with a warning, if etcd
// refuses it; with WithOwner, NewSession fails instead. The owner must be
// 1 to MaxOwnerLen bytes of printable UTF-8.
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

// defaultOwner is what an operator matches against a process list.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// recordOwner fails only for a given owner, a lost lease or ctx's end.
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

// Owner is the identity the session recorded, or empty if none.
func (s *Session) Owner() string { return s.owner }

// readOwner reads the owner record of lease id; empty if there is none.
func readOwner(ctx context.Context, client *clientv3.Client, id clientv3.LeaseID) (string, error) {
	resp, err := client.Get(ctx, OwnerKey(id))
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	// A record attached to another lease was not that session's.
	if clientv3.LeaseID(resp.Kvs[0].Lease) != id {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
