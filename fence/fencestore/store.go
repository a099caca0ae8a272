package fencestore

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
)

// Store keeps the highest token accepted per lock name. The transports'
// server side needs only this; MemoryStore and EtcdStore implement it.
type Store interface {
	// Accept records token for name if it is at least the highest token
	// accepted for name so far, in one atomic step. A lower token changes
	// nothing and gives an error wrapping a *fence.StaleError.
	Accept(ctx context.Context, name string, token int64) error
}

// MemoryStore is a Store in process memory, for tests and for services
// whose protected state lives in the same process. It forgets everything
// when the process ends. It is safe for concurrent use.
type MemoryStore struct {
	mu    sync.Mutex
	names map[string]*memoryRecord
}

type memoryRecord struct {
	mu      sync.Mutex // held across Do's write
	highest int64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{names: make(map[string]*memoryRecord)} }

func (s *MemoryStore) record(name string) *memoryRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.names[name]
	if !ok {
		r = &memoryRecord{}
		s.names[name] = r
	}
	return r
}

// Accept implements Store.
func (s *MemoryStore) Accept(ctx context.Context, name string, token int64) error {
	return s.Do(ctx, Claim{Name: name, Token: token}, nil)
}

// Do runs write only if c.Token is at least the highest token accepted for
// c.Name, and records c.Token if write returns nil, all while holding the
// name's record: no other Accept or Do of that name runs in between. A
// stale token gives a *fence.StaleError and write does not run. Do does not
// stop write when ctx ends; it only refuses to start once ctx has ended.
func (s *MemoryStore) Do(ctx context.Context, c Claim, write func() error) error {
	if c.Name == "" || c.Token <= 0 {
		return fmt.Errorf("fencestore: %w: lock %q token %d", fence.ErrInvalidArgument, c.Name, c.Token)
	}
	r := s.record(c.Name)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.Token < r.highest {
		return &fence.StaleError{Key: c.Name, Token: c.Token, Highest: r.highest}
	}
	if write != nil {
		if err := write(); err != nil {
			return err
		}
	}
	r.highest = c.Token
	return nil
}

// Highest returns the highest token accepted for name, 0 if none.
func (s *MemoryStore) Highest(name string) int64 {
	r := s.record(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.highest
}

// EtcdStore is a Store of fence.Resource records in etcd, one per lock
// name, at the prefix given to NewEtcdStore followed by the name. It survives restarts and is shared by every
// replica of a service. It is safe for concurrent use.
//
// Unless built WithoutVerifier, it accepts a token higher than its record
// only once etcd confirms it as the name's live holder's (Verify), by
// default asking the cluster the records are in.
type EtcdStore struct {
	kv     clientv3.KV
	prefix string
	verify *Verification // nil WithoutVerifier
}

// StoreOption configures NewEtcdStore.
type StoreOption func(*storeOptions) error

type storeOptions struct {
	v   Verifier
	off bool
}

// WithVerifier has the store confirm tokens with v instead of with an
// EtcdVerifier on its own client: an EtcdVerifier on a client of another
// cluster, for records kept apart from the locks, or on the store's own
// client with other options (WithReadTimeout).
func WithVerifier(v Verifier) StoreOption {
	return func(o *storeOptions) error {
		if v == nil {
			return fmt.Errorf("fencestore: %w: nil Verifier", fence.ErrInvalidArgument)
		}
		o.v = v
		return nil
	}
}

// WithoutVerifier has the store accept any well-formed token that is not
// stale, as before verification existed: for tokens that are not etcd lock
// keys' creation revisions. One wrong number then raises the record past
// every token etcd will hand out for years.
func WithoutVerifier() StoreOption {
	return func(o *storeOptions) error {
		o.off = true
		return nil
	}
}

// NewEtcdStore returns a Store whose records live under prefix, which must
// not be empty and must not be written by anything else. It verifies
// tokens through kv, which must then reach the etcd cluster that holds the
// locks, unless an option says otherwise.
func NewEtcdStore(kv clientv3.KV, prefix string, opts ...StoreOption) (*EtcdStore, error) {
	switch {
	case kv == nil:
		return nil, fmt.Errorf("fencestore: %w: nil kv", fence.ErrInvalidArgument)
	case prefix == "":
		return nil, fmt.Errorf("fencestore: %w: empty record prefix", fence.ErrInvalidArgument)
	}
	var o storeOptions
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("fencestore: %w: nil StoreOption", fence.ErrInvalidArgument)
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	s := &EtcdStore{kv: kv, prefix: prefix}
	switch {
	case o.off && o.v != nil:
		return nil, fmt.Errorf("fencestore: %w: both WithVerifier and WithoutVerifier", fence.ErrInvalidArgument)
	case o.off:
		return s, nil
	case o.v == nil:
		o.v = &EtcdVerifier{kv: kv, timeout: DefaultVerifyTimeout}
	}
	s.verify, _ = NewVerification(s, o.v) // neither is nil
	if ev, ok := o.v.(*EtcdVerifier); ok && ev.kv == kv {
		s.verify.both = s.readBoth(ev)
	}
	return s, nil
}

// readBoth reads the record of c's name and the name's keys created at or
// before c's token in one linearizable read-only transaction, for a store
// whose verifier reads the same cluster: a holding's first request costs
// one read, not two.
func (s *EtcdStore) readBoth(v *EtcdVerifier) func(ctx context.Context, c Claim) (int64, error, error) {
	return func(ctx context.Context, c Claim) (highest int64, verdict, err error) {
		rctx, cancel := context.WithTimeout(ctx, v.timeout)
		defer cancel()
		resp, err := s.kv.Txn(rctx).Then(
			clientv3.OpGet(s.Key(c.Name)),
			clientv3.OpGet(c.Name+"/", keysUpTo(c.Token)...),
		).Commit()
		if err != nil {
			return 0, nil, err
		}
		if rec := resp.Responses[0].GetResponseRange().GetKvs(); len(rec) > 0 {
			if highest, err = fence.DecodeToken(string(rec[0].Value)); err != nil {
				return 0, nil, err
			}
		}
		keys := resp.Responses[1].GetResponseRange().GetKvs()
		return highest, holding(c.Name, c.Token, resp.Header.GetRevision(), keys), nil
	}
}

// Key is the record key of the lock name.
func (s *EtcdStore) Key(name string) string { return s.prefix + name }

// Guard is the fence.Resource guard of c: put it on the fence.Txn that makes
// a handler's write, and the write happens only if c's token is still not
// stale, in the same etcd transaction that raises the record. Guard sends
// nothing and verifies nothing: call Verify first (fencehttp and fencegrpc
// do, before the handler runs).
func (s *EtcdStore) Guard(c Claim) fence.Guard { return fence.Resource(s.Key(c.Name), c.Token) }

// Verify returns nil if c's token may be written with Guard: it is at or
// below the record's (the guard then decides, as ever), or etcd confirms
// it as the live holder's of c.Name. Otherwise it returns an error wrapping a
// *fence.UnverifiedError, or ErrVerifierUnavailable if it could not ask.
// A confirmed token is remembered: a holding costs the store one read, once
// (its record and the name's lock keys in one transaction, when its
// verifier reads through the store's own client). Without a verifier it
// returns nil.
func (s *EtcdStore) Verify(ctx context.Context, c Claim) error {
	if s.verify == nil {
		return nil
	}
	return s.verify.Check(ctx, c)
}

// Accept implements Store with Verify, then a fence.Txn guarded by Guard and
// no writes of its own: it writes the record only when it is missing or below
// token, so a holder's requests after its first write nothing to etcd.
// Errors are those of Verify, then of fence.Txn.Commit: a
// *fence.StaleError, or one wrapping fence.ErrOutcomeUnknown when etcd did
// not answer.
func (s *EtcdStore) Accept(ctx context.Context, name string, token int64) error {
	if err := s.Verify(ctx, Claim{Name: name, Token: token}); err != nil {
		return err
	}
	_, err := fence.NewTxn(ctx, s.kv, s.Guard(Claim{Name: name, Token: token})).Commit()
	if err == nil && s.verify != nil {
		s.verify.note(name, 0, token)
	}
	return err
}

// readHighest reads the record of name: the highest token accepted, 0 if
// none.
func (s *EtcdStore) readHighest(ctx context.Context, name string) (int64, error) {
	return fence.ReadRecord(ctx, s.kv, s.Key(name))
}
