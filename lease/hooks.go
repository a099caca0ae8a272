package lease

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Hooks receive the events of a session and its locks, for metrics and
// traces (see packages fence/fenceprom and fence/fenceotel). Every field
// is optional. They are called on the library's goroutines and the
// callers', possibly at the same time: they must be safe for concurrent
// use, return quickly, never call back into the session, and never panic.
// A panic on one of the library's goroutines ends the process; one on a
// caller's goroutine, even if the caller recovers it, can leave the lock
// that call was taking queued or held in etcd, with no Lock to release
// it, until its session ends.
type Hooks struct {
	// Waiting is called with +1 when a Lock, RLock or Campaign starts
	// waiting behind another holder, and with -1 when it stops.
	Waiting func(name string, delta int)
	// Acquired is called when a lock or leadership is granted, with how
	// long the call took.
	Acquired func(name string, token int64, waited time.Duration)
	// Ended is called once when a granted lock or leadership ends, with
	// how long it was held and why (see Cause).
	Ended func(name string, token int64, held time.Duration, why error)
	// Delaying is called when a lock whose turn has come starts waiting
	// out the lock delay after the loss of the holding with token lost
	// (WithLockDelay), with the time left as etcd counts it (whole
	// seconds; 0 if not known). Called once per lost holding.
	Delaying func(name string, lost int64, left time.Duration)
	// Renewed is called at each keep-alive answer with the margin left:
	// the time from the answer to the session's new Deadline.
	Renewed func(margin time.Duration)
	// SessionLost is called once when the session ends involuntarily
	// (not by Close), with the reason, which wraps ErrLost.
	SessionLost func(why error)
	// Unanswered is called while NewSession (and so Run and Lead) waits
	// for etcd to answer its lease grant: after 2 s, then every 10 s, with
	// how long it has waited. A warning with the endpoints is logged too.
	Unanswered func(waited time.Duration)
	// Call is called as each Lock, RLock, TryLock, TryRLock and Campaign
	// call starts, with the caller's context, for tracing (see package
	// fence/fenceotel). The call goes on with the context Call returns,
	// which must be ctx or derived from it (nil means ctx): the requests
	// it sends (its put, its reads while it waits) carry that context's
	// values, so a traced etcd client shows them as its children. Watches,
	// which a session's locks share, do not. The CallHooks it returns (nil
	// for none) hear the rest of the call and of the holding it takes.
	Call func(ctx context.Context, c Call) (context.Context, *CallHooks)
}

// WithHooks sets the session's hooks; a nil *Hooks means none.
func WithHooks(h *Hooks) Option {
	return func(o *options) error {
		if h != nil {
			o.hooks = *h
		}
		return nil
	}
}

// Cause names why a lock ended, for metrics and logs: "released",
// "session_closed", "expired" (ErrLeaseExpired), "key_deleted",
// "revision_regressed", or "other".
func Cause(why error) string {
	switch {
	case errors.Is(why, ErrUnlocked):
		return "released"
	case errors.Is(why, ErrSessionClosed):
		return "session_closed"
	case errors.Is(why, ErrRevisionRegressed):
		return "revision_regressed"
	case errors.Is(why, ErrKeyDeleted):
		return "key_deleted"
	case errors.Is(why, ErrLeaseExpired):
		return "expired"
	}
	return "other"
}

func (h *Hooks) waiting(name string, delta int) {
	if h.Waiting != nil {
		h.Waiting(name, delta)
	}
}

// reportGranted logs and reports a grant. The end is reported once, by
// whichever of this and finishing runs second.
func (l *Lock) reportGranted(waited time.Duration) {
	t := l.t
	s := t.s
	// Check first: fields of a message nobody logs cost allocations.
	if ce := s.lg.Check(zap.InfoLevel, "lock granted"); ce != nil {
		ce.Write(zap.String("key", t.key), zap.Int64("token", t.token), zap.Duration("waited", waited))
	}
	if s.hooks.Acquired != nil {
		s.hooks.Acquired(t.name(), t.token, waited)
	}
	t.mu.Lock()
	t.hold.grantedAt = max(time.Since(s.born), 1)
	stopped := t.hold.finishedEnd
	t.mu.Unlock()
	if stopped {
		l.reportEnd()
	}
}

// finishing reports the end of a lock that was granted.
func (l *Lock) finishing() {
	t := l.t
	t.mu.Lock()
	t.hold.finishedEnd = true
	granted := t.hold.grantedAt != 0
	t.mu.Unlock()
	if granted {
		l.reportEnd()
	}
}

// reportEnd logs and reports how a granted lock ended (its ctx's cause).
func (l *Lock) reportEnd() {
	t := l.t
	s := t.s
	why, held := t.end.err(), time.Since(s.born)-t.hold.grantedAt
	cause := Cause(why)
	var ce *zapcore.CheckedEntry
	lost := cause != "released" && cause != "session_closed"
	if lost {
		ce = s.lg.Check(zap.WarnLevel, "lock lost")
	} else {
		ce = s.lg.Check(zap.InfoLevel, "lock released")
	}
	if ce != nil {
		fields := []zap.Field{zap.String("key", t.key), zap.Int64("token", t.token),
			zap.Duration("held", held), zap.String("cause", cause)}
		if lost {
			fields = append(fields, zap.Error(why))
		}
		ce.Write(fields...)
	}
	if s.hooks.Ended != nil {
		s.hooks.Ended(t.name(), t.token, held, why)
	}
	l.trace.ended(held, why)
}

// traceRelease starts the tracing of an Unlock or Resign of a granted holding:
// the context it goes on with, and the function that reports its error.
func (l *Lock) traceRelease(ctx context.Context, op string) (context.Context, func(error)) {
	ch := l.trace
	if ch == nil || ch.Release == nil {
		return ctx, func(error) {}
	}
	rctx, rch := ch.Release(ctx, op)
	if rctx == nil {
		rctx = ctx
	}
	return rctx, func(err error) { rch.done(l.t.token, err) }
}

// reportQueued tells the tracing hooks how many keys ahead block the
// lock: those its view lists, or, waiting on its Keeper's copy (whose view
// lists only the nearest), those the copy holds.
func (l *Lock) reportQueued() {
	t := l.t
	if l.trace == nil || l.trace.Queued == nil {
		return
	}
	t.mu.Lock()
	var mirrored bool
	var n int // granted: nothing is ahead
	if t.q != nil {
		mirrored, n = t.q.Mirrored(), t.q.Rule.AheadCount()
	}
	t.mu.Unlock()
	if mirrored {
		if m, ok := t.w.mirror().ahead(t.token, t.mode == Read); ok {
			n = m
		}
	}
	l.trace.Queued(n)
}
