package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Pool takes locks through sessions of one Keeper, opening them as it
// needs them, so that no session has more than a set number of locks at
// once: for a process that holds many locks, such as a shard owner. Each
// lock a session takes hangs on its lease, and with etcd's auth on every
// put that attaches a lease makes etcd check write permission on each key
// already on it, so on one lease the n-th lock costs in proportion to n.
// Spread over sessions of at most perSession locks each, a lock costs at
// most that many keys' checks, and taking n locks grows with n, not n
// squared. Without auth a pool costs more than one session (a watch
// stream, and a lease to renew, per perSession locks) and gains nothing.
//
// A pool's locks are ordinary locks of its sessions, with their
// guarantees. A lock's place on its session is free again by the time
// its Done closes or its Unlock returns. Two locks of one name taken
// through the pool may be on different sessions: they then queue in etcd
// as locks of two processes do, and exclude each other all the same. A
// session the pool lost ends its own locks only; the pool takes later
// locks through its other sessions, or a new one. Its methods are safe
// for concurrent use.
type Pool struct {
	keeper *Keeper
	per    int
	opts   []Option

	mu       sync.Mutex
	closed   bool
	sessions []*Session
	opening  chan struct{} // closed once the session being opened is in sessions; nil if none is
}

// place is a place on a session that a pool holds for a lock it is taking
// through it. The session counts it with its locks (holdPlace) until the
// lock is registered, which frees the place in the same step (trackLock),
// or the call ends before that (freePlace). The session's mutex guards
// held.
type place struct {
	s    *Session
	held bool
}

// holdPlace holds a place for a lock if the session has fewer than per
// locks and places, and has not ended; otherwise it returns nil.
func (s *Session) holdPlace(per int) *place {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.endedLocked() != nil || len(s.locks)+s.places >= per {
		return nil
	}
	s.places++
	return &place{s: s, held: true}
}

// freePlace gives back pl if it is still held.
func (s *Session) freePlace(pl *place) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freePlaceLocked(pl)
}

// freePlaceLocked is freePlace with s.mu held; pl may be nil.
func (s *Session) freePlaceLocked(pl *place) {
	if pl != nil && pl.held {
		pl.held = false
		s.places--
	}
}

// NewPool makes a pool that takes at most perSession locks through each
// of its sessions, which it opens through k with opts. It opens none
// before the first lock. A nil Keeper, a perSession under 1, an invalid
// Option or WithKeeper among opts (the pool gives its sessions k) gives an
// error wrapping ErrInvalidArgument.
func NewPool(k *Keeper, perSession int, opts ...Option) (*Pool, error) {
	o, err := buildOptions(opts)
	switch {
	case err != nil:
		return nil, failed("pool", err)
	case k == nil:
		return nil, failed("pool", fmt.Errorf("%w: nil Keeper", ErrInvalidArgument))
	case perSession < 1:
		return nil, failed("pool", fmt.Errorf("%w: %d locks per session", ErrInvalidArgument, perSession))
	case o.keeper != nil:
		return nil, failed("pool", fmt.Errorf("%w: WithKeeper: the pool's sessions are its Keeper's", ErrInvalidArgument))
	}
	return &Pool{keeper: k, per: perSession, opts: append(opts[:len(opts):len(opts)], WithKeeper(k))}, nil
}

// Lock takes the lock name as Session.Lock does, through a session of the
// pool with room for it, opened with ctx if none has. If that session
// ends, or the call's key is deleted, before the lock is granted (a
// revoked lease does both, the deletion first), it tries again: through
// another session if that one has ended, at most four times in all.
func (p *Pool) Lock(ctx context.Context, name string) (*Lock, error) {
	return p.take(ctx, Call{Op: "Lock", Name: name, Mode: Write}, false)
}

// TryLock takes the lock name as Session.TryLock does, through a session
// of the pool with room for it, as Lock does.
func (p *Pool) TryLock(ctx context.Context, name string) (*Lock, error) {
	return p.take(ctx, Call{Op: "TryLock", Name: name, Mode: Write}, true)
}

// poolTries bounds how many times a pool's Lock tries, each ended by the
// loss of its key or session before the grant.
const poolTries = 4

// take takes the lock c names through a session with room for it.
func (p *Pool) take(ctx context.Context, c Call, try bool) (l *Lock, err error) {
	for range poolTries {
		var pl *place
		pl, err = p.room(ctx)
		if err != nil {
			return nil, err
		}
		l, err = p.acquire(ctx, pl, c, try)
		if err == nil || ctx.Err() != nil || (pl.s.Err() == nil && !errors.Is(err, ErrLost)) {
			return l, err
		}
		// The session ended under the call, or the call's key went (its
		// lease was revoked, say, and etcd deleted the key before the
		// session heard of it): never granted, so try again. room drops
		// the session once it has seen its end.
	}
	return nil, err
}

// acquire is Session.acquire in the place pl, which it gives back if the
// lock never took it, however the call ends: a hook that panics included.
func (p *Pool) acquire(ctx context.Context, pl *place, c Call, try bool) (*Lock, error) {
	defer pl.s.freePlace(pl)
	return pl.s.acquire(ctx, c, "", try, pl)
}

// room returns a place on a session with room for one more lock; it opens
// a session if none has room. One session is opened at a time: the
// callers that find no room meanwhile wait for it.
func (p *Pool) room(ctx context.Context) (*place, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrSessionClosed
		}
		pl, ended := p.withRoomLocked()
		if pl != nil || len(ended) > 0 {
			p.mu.Unlock()
			closeEnded(ended)
			if pl != nil {
				return pl, nil
			}
			continue
		}
		if opening := p.opening; opening != nil {
			p.mu.Unlock()
			select {
			case <-opening:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		opened := make(chan struct{})
		p.opening = opened
		p.mu.Unlock()
		if err := p.open(ctx, opened); err != nil {
			return nil, err
		}
	}
}

// withRoomLocked holds a place on the first live session with room for a
// lock, if any. It takes the sessions that have ended out of the pool and
// returns them, to be closed. p.mu is held.
func (p *Pool) withRoomLocked() (found *place, ended []*Session) {
	live := p.sessions[:0]
	for _, s := range p.sessions {
		if s.Err() != nil {
			ended = append(ended, s) // its locks have ended with it
			continue
		}
		live = append(live, s)
		if found == nil {
			found = s.holdPlace(p.per)
		}
	}
	clear(p.sessions[len(live):])
	p.sessions = live
	return found, ended
}

// closeEnded closes sessions that ended on their own, which frees what
// they hold of their Keeper; their errors say how they ended, which
// their locks' Err said already.
func closeEnded(ended []*Session) {
	for _, s := range ended {
		_ = s.Close()
	}
}

// open opens a session for the pool. However it ends (a hook that
// panics included), it lets the callers waiting on opened look again,
// the new session in the pool by then if it opened.
func (p *Pool) open(ctx context.Context, opened chan struct{}) error {
	defer close(opened)
	defer func() {
		p.mu.Lock()
		p.opening = nil
		p.mu.Unlock()
	}()
	s, err := NewSession(ctx, p.keeper.client, p.opts...)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = s.Close() // a session no lock was taken through: nothing to report
		return ErrSessionClosed
	}
	p.sessions = append(p.sessions, s)
	p.mu.Unlock()
	return nil
}

// Close closes every session of the pool (Session.Close: their locks end
// with ErrSessionClosed), and makes later Lock and TryLock calls fail with
// ErrSessionClosed. It returns the errors of those Closes, joined: one for
// a session that had ended on its own says how, unless a Lock had found
// it ended first, which closed it and dropped it from the pool. A second
// Close returns ErrSessionClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrSessionClosed
	}
	p.closed = true
	sessions := p.sessions
	p.sessions = nil
	p.mu.Unlock()
	var errs []error
	for _, s := range sessions {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// Sessions is how many sessions the pool has open and not ended.
func (p *Pool) Sessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.sessions {
		if s.Err() == nil {
			n++
		}
	}
	return n
}
