package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/lease/internal/grant"
	"github.com/leasefence/leasefence/lease/internal/keyread"
	"github.com/leasefence/leasefence/lease/internal/keywrite"
	"github.com/leasefence/leasefence/lease/internal/renew"
	"github.com/leasefence/leasefence/lease/internal/watch"
)

// Session is one etcd lease, kept alive until Close or its loss, under
// which any number of locks are held. Its methods are safe for concurrent
// use. Without renewal, Done closes at the session's Deadline, which is
// ahead of etcd's expiry by a margin (see Deadline), or earlier by as late
// as its renewer's timer (its own, or its Keeper's) has fired in the
// last 10 to 20 s (at most a quarter of the TTL), so that a loaded
// process still wakes in time; or sooner, on Close, a revoke etcd reports, or a revision
// regression. A process that runs no later than it did lately is told of
// a loss before etcd can hand its locks to anyone else. One stalled past
// that, or paused, learns late, and sees nothing until it runs again: Done
// is an early warning; fence the writes.
type Session struct {
	client  *clientv3.Client
	id      clientv3.LeaseID
	ttl     time.Duration
	lg      *zap.Logger
	clock   clock
	seam    faultSeam // empty in release builds; see ownership.go
	hooks   Hooks
	keeper  *Keeper // nil without WithKeeper
	renewer *renew.Renewer
	// lockDelay is WithLockDelay's; holdings, the writers Close unlocks
	// before the revoke so that successors see clean releases.
	lockDelay time.Duration
	holdings  map[*Lock]struct{}
	// delayID is the lease the session's "held" delay records are on
	// (delaylease.go); 0 until the first.
	delayID atomic.Int64
	owner   string // as recorded; empty if not
	// born is when the session was made: its locks keep their grant
	// times as durations since (keyState.grantedAt).
	born time.Time

	// ctx ends, with the reason as its cause, when the session ends.
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex // guards closed, deadline, holdings, locks and places
	closed   bool
	deadline time.Time

	gates  registry[*gate]    // makes locks of one name on this session take turns
	locks  map[*Lock]struct{} // every lock not finished (trackLock); mu guards it
	places int                // places a Pool holds for locks not yet in locks (hold)
	stream *watch.Stream      // carries the session's watches
	// rechecks batches held locks' reads of their keys (recheck).
	rechecks keyread.Batcher

	wg sync.WaitGroup // every lock monitor and revision check

	// highest is the highest store revision seen in a response header;
	// probeKey, the last lock key taken, is read to confirm a regression.
	highest  atomic.Int64
	probeKey atomic.Value // string

	failing atomic.Bool // set by the first involuntary end, so that it is reported once
	// markers: what the session knows of its lock keys' markers
	// (lease/internal/keywrite).
	markers keywrite.Book
	// keys sends the writes of lock keys that writes.go lists: the client,
	// or in tests a KV that loses and delays requests (write model).
	keys   clientv3.KV
	writes keywrite.Seam // the write model's mutants; empty in release builds
}

// NewSession grants a lease of the configured TTL and keeps it alive until
// Close or its loss. ctx bounds only this call. While etcd does not answer
// the grant, NewSession waits (reporting it to Hooks.Unanswered and the
// log); when ctx ends it fails with an error that matches ctx's, says that
// etcd did not answer, and names the endpoints. Bad input gives an error
// wrapping ErrInvalidArgument before anything is sent; a TLS handshake that
// fails for a certificate reason gives one wrapping ErrTLSHandshake at once.
func NewSession(ctx context.Context, client *clientv3.Client, opts ...Option) (*Session, error) {
	if client == nil {
		return nil, errNilClient
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.keeper != nil && o.keeper.client != client {
		return nil, fmt.Errorf("%w: the Keeper renews leases through another client", ErrInvalidArgument)
	}
	sent := o.clock.Now()
	resp, err := grant.Grant(ctx, client, ttlSeconds(o.ttl), ErrTLSHandshake, func(waited time.Duration) {
		o.logger.Warn("etcd has not answered a lease grant; still trying",
			zap.Strings("endpoints", client.Endpoints()), zap.Duration("waited", waited))
		if o.hooks.Unanswered != nil {
			o.hooks.Unanswered(waited)
		}
	})
	if err != nil {
		return nil, failed("grant", err)
	}
	granted := o.grantedTTL(resp.TTL)
	s := &Session{
		born:      time.Now(),
		client:    client,
		keys:      client,
		id:        resp.ID,
		ttl:       granted,
		lg:        o.logger.With(zap.String("lease", fmt.Sprintf("%x", int64(resp.ID)))),
		clock:     o.clock,
		seam:      o.seam,
		hooks:     o.hooks,
		keeper:    o.keeper,
		lockDelay: o.lockDelay,
		deadline:  localDeadline(sent, granted),
	}
	s.gates.open, s.gates.shut = s.openGate, func(g *gate) { g.w.stop() }
	if err := s.recordOwner(ctx, o); err != nil {
		s.revoke()
		return nil, failed("session", err)
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	// The stream's context carries require-leader: a member cut off from
	// the quorum ends the stream rather than leave it silent.
	s.stream = watch.NewStream(clientv3.WithRequireLeader(s.ctx), client, (*sessionOwner)(s))
	s.rechecks = keyread.Batcher{Client: client, Max: recheckBatch, MaxInFlight: recheckInFlight, Ctx: s.ctx, Timeout: granted, Go: s.goTracked}
	if s.keeper != nil {
		if err := s.keeper.add(s); err != nil {
			s.end(err)
			s.revoke()
			return nil, failed("session", err)
		}
		s.renewer = s.keeper.renewer
	} else { // a renewer of its own, which stops as the session ends
		s.renewer = renew.New(s.ctx, client, s.clock, 0, granted/6)
		s.renewer.Add(kept{s})
	}
	s.wg.Add(1) // endLocks
	context.AfterFunc(s.ctx, s.endLocks)
	s.lg.Info("session started", zap.Duration("ttl", granted))
	return s, nil
}

// Lease is the session's etcd lease ID: not a fencing token (not ordered).
// Do not build other lock clients on it (a concurrency.Mutex with
// concurrency.WithLease, say): their keys sit at the session's own lock
// paths, and a lock of such a name through the session is refused with
// ErrKeyInUse.
func (s *Session) Lease() clientv3.LeaseID { return s.id }

// TTL is the lease TTL etcd granted, which may exceed the one asked for.
func (s *Session) TTL() time.Duration { return s.ttl }

// Client is the etcd client the session uses.
func (s *Session) Client() *clientv3.Client { return s.client }

// Done is closed when the session ends, by Close or involuntarily (see
// Err). An involuntary end has been reported to Hooks.SessionLost by then.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err is nil while the session is alive. After Done is closed it says why:
// ErrSessionClosed after Close, otherwise an error wrapping ErrLost
// (ErrLeaseExpired or ErrRevisionRegressed).
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Deadline is when the session takes its lease to end unless renewed: the
// send time of the last keep-alive etcd answered, plus the TTL it granted,
// less a margin of a twentieth of the TTL (at most 1 s). If the clocks run
// at the same rate, etcd's expiry is at least that margin later. The
// session ends at Deadline less its renewal timers' recent lateness (see
// Session), which is about a millisecond on an idle machine.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Close releases every lock of the session (their Err is ErrSessionClosed),
// revokes the lease within the TTL and waits for the session's goroutines.
// A second Close returns ErrSessionClosed. After an involuntary end it
// returns an error wrapping ErrLost that says how the session ended.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	s.closed = true
	held := s.holdings
	s.holdings = nil
	s.mu.Unlock()
	s.releaseHoldings(held)
	s.end(ErrSessionClosed)
	s.renewer.Remove(kept{s})
	if s.keeper == nil {
		<-s.renewer.Done()
	}
	s.gates.close()
	s.wg.Wait()
	if cause := context.Cause(s.ctx); errors.Is(cause, ErrLeaseExpired) {
		return failed("close", fmt.Errorf("session had already ended: %w", cause))
	}
	s.revokeDelayLease()
	if err := s.revoke(); err != nil {
		return failed("revoke", err)
	}
	if cause := context.Cause(s.ctx); cause != ErrSessionClosed {
		return failed("close", fmt.Errorf("session had already ended: %w", cause))
	}
	return nil
}

// releaseHoldings unlocks the writers before the revoke, for clean
// releases; one that fails leaves its successor to wait out the delay.
func (s *Session) releaseHoldings(held map[*Lock]struct{}) {
	for l := range held {
		if l.t.end.err() != nil {
			continue // ended between its grant and its registration
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
		if err := l.unlock(ctx); err != nil {
			s.lg.Warn("lock not released before revoking the lease: its successor will wait out the lock delay",
				zap.String("key", l.t.key), zap.Error(err))
		}
		cancel()
	}
}

// hold registers a granted writer for releaseHoldings unless Close began.
func (s *Session) hold(l *Lock) {
	if s.lockDelay == 0 || l.t.mode == Read {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.holdings == nil {
		s.holdings = make(map[*Lock]struct{})
	}
	s.holdings[l] = struct{}{}
}

func (s *Session) unhold(l *Lock) {
	if s.lockDelay == 0 {
		return
	}
	s.mu.Lock()
	delete(s.holdings, l)
	s.mu.Unlock()
}

// revoke waits at most the TTL: past it the lease has expired anyway.
func (s *Session) revoke() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	if _, err := s.client.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return err
	}
	return nil
}

func (s *Session) lose(reason string) {
	if s.ctx.Err() != nil || !s.failing.CompareAndSwap(false, true) {
		return
	}
	why := fmt.Errorf("%w: %s", ErrLeaseExpired, reason)
	s.lg.Warn("lease lost", zap.String("reason", reason))
	s.fail(why)
}

// fail reports an involuntary end to the hooks before it ends the session,
// so that the loss is reported by the time Done closes.
func (s *Session) fail(why error) {
	if s.hooks.SessionLost != nil {
		s.hooks.SessionLost(why)
	}
	s.end(why)
}

// end ends the session with cause, unless it has ended: its locks first,
// with the same cause, then its context, under s.mu. So a lock is never
// seen held once the session is seen ended (Session.Err, Done), and none
// is registered after (trackLock refuses it). Their finish, which reports
// each end and closes its Done, is left to endLocks, on a goroutine of
// its own: cancelling a lock's ending runs no code of the lock's.
func (s *Session) end(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	for l := range s.locks {
		l.t.end.end(cause)
	}
	s.cancel(cause)
}

// localDeadline is the deadline a keep-alive sent at sent earns when etcd
// answers with ttl. etcd's expiry counts from when it received the
// request, so sent plus ttl is already no later than it; the margin
// absorbs this process's own small delays (a timer a little late, a short
// GC pause) so that Done still closes before etcd's revocation, which can
// come at the very instant of expiry. Larger, lasting lateness on a loaded
// machine is measured, and aimed off, by the renewer (renew.Renewer's lag).
func localDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - lossMargin(ttl))
}

// lossMargin is how far ahead of etcd's expiry a session ends at least (the
// renewer's lag comes on top): a twentieth of the TTL (100 ms for etcd's
// shortest lease), at most 1 s.
func lossMargin(ttl time.Duration) time.Duration {
	return min(ttl/20, time.Second)
}

// extend moves the local deadline on, never back.
func (s *Session) extend(deadline time.Time) {
	s.mu.Lock()
	if deadline.After(s.deadline) {
		s.deadline = deadline
	}
	s.mu.Unlock()
	if s.hooks.Renewed != nil {
		s.hooks.Renewed(s.untilDeadline())
	}
}

// sawRevision records the store revision of a write's answer; seen is
// the highest the session had seen before it sent the write. Only an
// answer below seen is suspect: writes in flight together are answered
// in any order, so one below a revision seen after it was sent proves
// nothing (it cost a read per lock when many were taken at once). A
// suspect one may be a lagging member's, so only a lower linearizable
// read ends the session.
func (s *Session) sawRevision(seen, rev int64) {
	s.recordRevision(rev)
	if rev < seen {
		s.confirmRegression(seen)
	}
}

// checkRevision is sawRevision for the renewer's loop: it never waits.
func (s *Session) checkRevision(rev int64) {
	highest, ok := s.recordRevision(rev)
	if ok || s.track() != nil {
		return
	}
	go func() {
		defer s.wg.Done()
		s.confirmRegression(highest)
	}()
}

// recordRevision raises highest to rev; false, with highest, if rev is lower.
func (s *Session) recordRevision(rev int64) (int64, bool) {
	highest := s.highest.Load()
	for rev >= highest {
		if s.highest.CompareAndSwap(highest, rev) {
			return rev, true
		}
		highest = s.highest.Load()
	}
	return highest, false
}

func (s *Session) confirmRegression(highest int64) {
	// Bounded by the local deadline too: past it, the session is lost.
	ctx, cancel := context.WithTimeout(s.ctx, min(s.ttl/3, s.untilDeadline()))
	defer cancel()
	key, _ := s.probeKey.Load().(string)
	if key == "" {
		key = lockKey("leasefence-revision-probe", s.id)
	}
	resp, err := s.client.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil || resp.Header.Revision >= highest {
		return
	}
	if s.ctx.Err() != nil || !s.failing.CompareAndSwap(false, true) {
		return
	}
	s.lg.Error("etcd's store revision went backwards: fencing tokens can repeat; restore etcd with etcdutl snapshot restore --bump-revision N --mark-compacted",
		zap.Int64("highest_seen", highest), zap.Int64("now", resp.Header.Revision))
	s.fail(fmt.Errorf("%w: highest seen %d, now %d", ErrRevisionRegressed, highest, resp.Header.Revision))
}

// lastSent is when the last keep-alive etcd answered was sent (or the
// grant), as its deadline records it.
func (s *Session) lastSent() time.Time {
	return s.Deadline().Add(lossMargin(s.ttl) - s.ttl)
}

func (s *Session) untilDeadline() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.deadline.Sub(s.clock.Now()), 0)
}

// alive is nil while the session can take locks, else how it ended.
func (s *Session) alive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endedLocked()
}

// endedLocked says how the session ended, nil while it lives. s.mu is held.
func (s *Session) endedLocked() error {
	switch {
	case s.ctx.Err() != nil:
		return context.Cause(s.ctx)
	case s.closed: // Close has begun and not yet cancelled
		return ErrSessionClosed
	}
	return nil
}

// bound returns ctx, also cancelled with the session's cause when it ends.
func (s *Session) bound(ctx context.Context) (context.Context, func()) {
	return linkCause(ctx, s.ctx)
}

// trackLock registers a lock whose finish Close waits for, unless the
// session ended; finish calls untrackLock, and s.wg.Done last. When the
// session ends, endLocks runs finish for every lock still registered. A
// place a Pool held for the lock becomes the lock's entry in the same
// step, so the pool never counts the lock twice or not at all.
func (s *Session) trackLock(l *Lock, pl *place) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.trackLocked(); err != nil {
		return err
	}
	if s.locks == nil {
		s.locks = map[*Lock]struct{}{}
	}
	s.locks[l] = struct{}{}
	s.freePlaceLocked(pl)
	return nil
}

// untrackLock stops counting a finishing lock; finish calls s.wg.Done
// once it is through.
func (s *Session) untrackLock(l *Lock) {
	s.mu.Lock()
	delete(s.locks, l)
	s.mu.Unlock()
}

// endLocks finishes every lock registered as the session ends: end has
// ended each already, with the session's cause. One context.AfterFunc per
// session rather than one per lock (0.4 KB each with 100,000 held).
func (s *Session) endLocks() {
	defer s.wg.Done()
	s.mu.Lock()
	ls := make([]*Lock, 0, len(s.locks))
	for l := range s.locks {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	// end has ended each lock registered; ending one again with the same
	// cause changes nothing, and keeps finish from running before a lock's
	// Err is set should one have been missed.
	cause := context.Cause(s.ctx)
	for _, l := range ls {
		l.t.end.end(cause)
		l.finishLater()
	}
}

// track registers a goroutine Close waits for, unless the session ended.
func (s *Session) track() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trackLocked()
}

// goTracked runs f on a goroutine Close waits for, unless the session
// ended.
func (s *Session) goTracked(f func()) error {
	if err := s.track(); err != nil {
		return err
	}
	go func() {
		defer s.wg.Done()
		f()
	}()
	return nil
}

// trackLocked is track with s.mu held.
func (s *Session) trackLocked() error {
	if err := s.endedLocked(); err != nil {
		return err
	}
	s.wg.Add(1)
	return nil
}

// kept is a Session as its renewer sees it (renew.Session). A value that
// holds only the pointer: two are equal when their sessions are the same,
// which is how the renewer tells sessions apart.
type kept struct{ s *Session }

func (k kept) Lease() clientv3.LeaseID { return k.s.id }
func (k kept) TTL() time.Duration      { return k.s.ttl }
func (k kept) Deadline() time.Time     { return k.s.Deadline() }
func (k kept) Ended() bool             { return k.s.ctx.Err() != nil }
func (k kept) Lose(reason string)      { k.s.lose(reason) }
func (k kept) Also() clientv3.LeaseID  { return clientv3.LeaseID(k.s.delayID.Load()) }

// Renewed extends the deadline by etcd's answer, of ttl seconds, to a
// keep-alive sent at sent, and checks the answer's revision.
func (k kept) Renewed(sent time.Time, ttl, revision int64) {
	k.s.extend(localDeadline(sent, k.s.renewedTTL(ttl)))
	k.s.checkRevision(revision)
}
