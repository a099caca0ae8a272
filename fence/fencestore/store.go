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
type EtcdStore struct {
	kv     clientv3.KV
	prefix string
}

// NewEtcdStore returns a Store whose records live under prefix, which must
// not be empty and must not be written by anything else.
func NewEtcdStore(kv clientv3.KV, prefix string) (*EtcdStore, error) {
	switch {
	case kv == nil:
		return nil, fmt.Errorf("fencestore: %w: nil kv", fence.ErrInvalidArgument)
	case prefix == "":
		return nil, fmt.Errorf("fencestore: %w: empty record prefix", fence.ErrInvalidArgument)
	}
	return &EtcdStore{kv: kv, prefix: prefix}, nil
}

// Key is the record key of the lock name.
func (s *EtcdStore) Key(name string) string { return s.prefix + name }

// Guard is the fence.Resource guard of c: put it on the fence.Txn that makes
// a handler's write, and the write happens only if c's token is still not
// stale, in the same etcd transaction that raises the record.
func (s *EtcdStore) Guard(c Claim) fence.Guard { return fence.Resource(s.Key(c.Name), c.Token) }

// Accept implements Store with a fence.Txn guarded by Guard and no writes
// of its own: it writes the record only when it is missing or below
// token, so a holder's requests after its first write nothing to etcd.
// Errors are those of fence.Txn.Commit: a *fence.StaleError, or one
// wrapping fence.ErrOutcomeUnknown when etcd did not answer.
func (s *EtcdStore) Accept(ctx context.Context, name string, token int64) error {
	_, err := fence.NewTxn(ctx, s.kv, s.Guard(Claim{Name: name, Token: token})).Commit()
	return err
}
