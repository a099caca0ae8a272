package fencestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/internal/queuekey"
)

// ErrVerifierUnavailable reports that a Verifier could not tell whether a
// token is the lock holder's (etcd did not answer in time, or
// refused the read). The request is refused as unknown, never accepted
// unverified, and nothing is recorded.
var ErrVerifierUnavailable = errors.New("fencestore: token verifier unavailable")

// DefaultVerifyTimeout bounds an EtcdVerifier's read unless
// WithReadTimeout says otherwise.
const DefaultVerifyTimeout = 5 * time.Second

// Verifier tells whether a token offered for a lock name is the token of
// that name's live holder (or of one of its readers), not a waiter's nor
// one no holding ever had: a fence asks it before it accepts a token
// higher than any it has accepted, so that a wrong number cannot raise it.
type Verifier interface {
	// Verify returns nil if token is the live holder's of lock name, an
	// error wrapping a *fence.UnverifiedError if it is not, and an error
	// wrapping ErrVerifierUnavailable (or the error of ctx, once ctx
	// has ended) if it could not tell.
	Verify(ctx context.Context, name string, token int64) error
}

// EtcdVerifier is the Verifier that asks the etcd cluster holding the
// locks. A token is the live holder's of name if, in one linearizable read
// of the keys under name + "/" created at or before it, a key directly
// under name + "/" in etcd's lock layout (name/<lease ID in lowercase
// hex>, as package lease, etcd's concurrency package and etcdctl lock
// write it) has creation revision token, is attached to the lease its name
// encodes, and waits behind no older key of the queue: for a writer's key
// none, for a reader's (package lease's RLock) no writer's. That is the
// rule package lease grants by, applied to what etcd holds; such a key
// exists only while its lease lives. A token above the read's revision is
// no holding at all.
type EtcdVerifier struct {
	kv      clientv3.KV
	timeout time.Duration
}

// VerifierOption configures NewEtcdVerifier.
type VerifierOption func(*EtcdVerifier) error

// WithReadTimeout bounds each read of the verifier (DefaultVerifyTimeout
// otherwise): a read that takes longer fails with ErrVerifierUnavailable.
func WithReadTimeout(d time.Duration) VerifierOption {
	return func(v *EtcdVerifier) error {
		if d <= 0 {
			return fmt.Errorf("fencestore: %w: read timeout %v is not positive", fence.ErrInvalidArgument, d)
		}
		v.timeout = d
		return nil
	}
}

// NewEtcdVerifier returns a Verifier that reads the lock keys through kv,
// a client of the etcd cluster that holds the locks.
func NewEtcdVerifier(kv clientv3.KV, opts ...VerifierOption) (*EtcdVerifier, error) {
	if kv == nil {
		return nil, fmt.Errorf("fencestore: %w: nil kv", fence.ErrInvalidArgument)
	}
	v := &EtcdVerifier{kv: kv, timeout: DefaultVerifyTimeout}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("fencestore: %w: nil VerifierOption", fence.ErrInvalidArgument)
		}
		if err := o(v); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// Verify implements Verifier with one range read of name's keys created
// at or before revision token.
func (v *EtcdVerifier) Verify(ctx context.Context, name string, token int64) error {
	if err := checkClaim(Claim{Name: name, Token: token}); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	// Linearizable: a serializable read of a lagging member could miss a
	// key just created and refuse a fresh holder's token.
	resp, err := v.kv.Get(rctx, name+"/", keysUpTo(token)...)
	switch {
	case err == nil:
		return holding(name, token, resp.Header.GetRevision(), resp.Kvs)
	case ctx.Err() != nil:
		return fmt.Errorf("fencestore: verify token %d of lock %q: %w", token, name, context.Cause(ctx))
	}
	return fmt.Errorf("%w: token %d of lock %q: %w", ErrVerifierUnavailable, token, name, err)
}

// keysUpTo are the options of the read holding decides from, of a name's
// keys (name + "/") created at or before revision token.
func keysUpTo(token int64) []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(token)}
}

// holding decides from a read at revision rev of name's keys created at or
// before token whether token is the holder's: a queue key of name
// (queuekey.IsQueueKey) created at token, with no older queue key that
// blocks it (queuekey.Blocks). Keys of a lock nested under name, data keys
// and a key moved off its lease are no queue keys.
func holding(name string, token, rev int64, kvs []*mvccpb.KeyValue) error {
	e := &fence.UnverifiedError{Name: name, Token: token, Revision: rev}
	if token > rev {
		return e
	}
	pfx := name + "/"
	var own *mvccpb.KeyValue
	for _, kv := range kvs {
		switch {
		case kv.CreateRevision != token || !queuekey.IsChild(pfx, kv):
		case queuekey.IsQueueKey(pfx, kv):
			own = kv
		default:
			if _, ok := fence.KeyLease(string(kv.Key)); ok {
				e.Key, e.Detached = string(kv.Key), true // moved off its lease by someone's put
			}
		}
	}
	if own == nil {
		return e
	}
	reader := queuekey.IsReader(own)
	for _, kv := range kvs {
		if kv.CreateRevision < token && queuekey.Blocks(pfx, reader, kv) {
			e.Key, e.Ahead = string(own.Key), string(kv.Key)
			return e
		}
	}
	return nil
}

// checkClaim refuses what no fence can take, before anything is sent. It
// takes any name package lease does (which may be longer than MaxNameLen
// or hold characters that CheckName refuses for the transports' sake): a
// store must not refuse a holder whose lock was granted.
func checkClaim(c Claim) error {
	if c.Name == "" {
		return fmt.Errorf("fencestore: %w: empty lock name", fence.ErrInvalidArgument)
	}
	if c.Token <= 0 {
		return fmt.Errorf("fencestore: %w: lock %q token %d: tokens are positive", fence.ErrInvalidArgument, c.Name, c.Token)
	}
	return nil
}

// maxRemembered bounds the lock names a Verification remembers; past it,
// it forgets them all and verifies each holding again once.
const maxRemembered = 4096

// Verification is one fence's use of a Verifier: which tokens it asks
// about, and what it remembers of the answers. A token at or below the
// highest its Store has accepted for the name is left to the Store, as
// without verification: no read. A higher one passes only once the
// Verifier confirms it, and the confirmed token is remembered, so a
// holding costs one read per fence. It is safe for concurrent use.
type Verification struct {
	v       Verifier
	highest func(ctx context.Context, name string) (int64, error)
	// both, if set, reads the store's highest and verifies in one request
	// (an EtcdStore whose verifier is its own client's): verdict is the
	// Verifier's, for a token above highest.
	both func(ctx context.Context, c Claim) (highest int64, verdict, err error)

	mu    sync.Mutex
	names map[string]known
}

// known is what a Verification knows of one lock name: the token it last
// confirmed, and a lower bound of the highest the Store has accepted
// (stores only ever raise it).
type known struct{ verified, accepted int64 }

// NewVerification returns the Verification of a fence whose Store is s and
// whose tokens v confirms. For a *MemoryStore or an *EtcdStore it reads the
// highest token accepted from s; for another Store it verifies every token
// it does not remember, so that a stale token of an ended holding is
// refused as unverified rather than as stale. An EtcdStore verifies its
// tokens itself (NewEtcdStore); this is for stores that cannot.
func NewVerification(s Store, v Verifier) (*Verification, error) {
	if s == nil || v == nil {
		return nil, fmt.Errorf("fencestore: %w: nil Store or Verifier", fence.ErrInvalidArgument)
	}
	x := &Verification{v: v, names: make(map[string]known)}
	switch st := s.(type) {
	case *MemoryStore:
		x.highest = func(_ context.Context, name string) (int64, error) { return st.Highest(name), nil }
	case *EtcdStore:
		x.highest = st.readHighest
	default:
		x.highest = func(context.Context, string) (int64, error) { return 0, nil }
	}
	return x, nil
}

// Check returns nil if c may go on to the Store: its token is the one last
// confirmed for its name, at or below the highest the Store has accepted
// (the Store then decides, as without verification), or confirmed now by
// the Verifier. Otherwise it returns the Verifier's error: a
// *fence.UnverifiedError, or one wrapping ErrVerifierUnavailable.
func (x *Verification) Check(ctx context.Context, c Claim) error {
	if err := checkClaim(c); err != nil {
		return err
	}
	k := x.known(c.Name)
	if c.Token == k.verified || c.Token <= k.accepted {
		return nil
	}
	var h int64
	var verdict, err error
	if x.both != nil {
		h, verdict, err = x.both(ctx, c)
	} else {
		h, err = x.highest(ctx, c.Name)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil || errors.Is(err, fence.ErrBadRecord):
		return fmt.Errorf("fencestore: verify token %d of lock %q: %w", c.Token, c.Name, err)
	default:
		return fmt.Errorf("%w: read the record of lock %q: %w", ErrVerifierUnavailable, c.Name, err)
	}
	x.note(c.Name, 0, h)
	if c.Token <= h {
		return nil
	}
	if x.both == nil {
		verdict = x.v.Verify(ctx, c.Name, c.Token)
	}
	if verdict != nil {
		return verdict
	}
	x.note(c.Name, c.Token, 0)
	return nil
}

func (x *Verification) known(name string) known {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.names[name]
}

// note records a confirmed token (verified) or a lower bound of the
// Store's highest (accepted); zero leaves that part as it is.
func (x *Verification) note(name string, verified, accepted int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	k, ok := x.names[name]
	if !ok && len(x.names) >= maxRemembered {
		clear(x.names)
	}
	if verified != 0 {
		k.verified = verified
	}
	k.accepted = max(k.accepted, accepted)
	x.names[name] = k
}

// claimVerifier is a Store that verifies tokens itself (*EtcdStore).
type claimVerifier interface {
	Verify(ctx context.Context, c Claim) error
}

// VerifyFunc is what a transport fence over s puts in Request.Verify: the
// Check of a new Verification with v; with v nil, the store's own Verify
// if it has one (an *EtcdStore), and nil otherwise (no verification). A
// Verifier given for a store that verifies itself is refused: give it to
// the store (WithVerifier).
func VerifyFunc(s Store, v Verifier) (func(ctx context.Context, c Claim) error, error) {
	own, verifies := s.(claimVerifier)
	switch {
	case v != nil && verifies:
		return nil, fmt.Errorf("fencestore: %w: a %T verifies tokens itself: give it the Verifier (WithVerifier)", fence.ErrInvalidArgument, s)
	case v != nil:
		x, err := NewVerification(s, v)
		if err != nil {
			return nil, err
		}
		return x.Check, nil
	case verifies:
		return own.Verify, nil
	}
	return nil, nil
}
