package lease

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Hooks receive the events of a session and its locks, for metrics. Every
// field is optional. The functions are called on the library's goroutines,
// possibly at the same time: they must be safe for concurrent use, return
// quickly, and never call back into the session. Package fence/fenceprom
// turns them into Prometheus collectors.
type Hooks struct {
	// Waiting is called with +1 when a Lock or Campaign starts waiting
	// behind another holder, and with -1 when it stops waiting, granted or
	// not.
	Waiting func(name string, delta int)
	// Acquired is called when a lock or leadership is granted, with how
	// long the call took.
	Acquired func(name string, token int64, waited time.Duration)
	// Ended is called once when a granted lock or leadership ends, with
	// how long it was held and why: ErrUnlocked (released), ErrSessionClosed
	// (its session was closed), or an error wrapping ErrLost (see Cause).
	Ended func(name string, token int64, held time.Duration, why error)
	// Renewed is called at each keep-alive answer with the margin left:
	// the session's new local deadline minus the time of the answer, the
	// budget within which the process would still see a loss in time.
	Renewed func(margin time.Duration)
	// SessionLost is called once when the session's lease is lost (not
	// when it is closed), with the reason, which wraps ErrLost.
	SessionLost func(why error)
	// Unanswered is called while NewSession (and so Run and Lead) waits
	// for etcd to answer its lease grant: after 2 s without an answer,
	// then every 10 s, with how long it has waited. An etcd that cannot
	// be reached shows here, and in a warning logged with the endpoints.
	Unanswered func(waited time.Duration)
}

// WithHooks sets the hooks that receive the session's events. A nil *Hooks
// means none.
func WithHooks(h *Hooks) Option {
	return func(o *options) error {
		if h != nil {
			o.hooks = *h
		}
		return nil
	}
}

// Cause names why a lock ended, for metrics and logs: "released",
// "session_closed", "expired" (the lease ended: expired, revoked, or not
// renewed in time), "key_deleted", "revision_regressed" (see
// ErrRevisionRegressed), or "other".
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

// waiting reports a waiter of name coming (+1) or going (-1).
func (h *Hooks) waiting(name string, delta int) {
	if h.Waiting != nil {
		h.Waiting(name, delta)
	}
}

// reportGranted logs and reports a grant. The lock's end is reported by
// reportEnd, once: by finish as the lock finishes (so that Session.Close
// and Done wait for it), or here if it finished before the grant was
// recorded.
func (l *Lock) reportGranted(waited time.Duration) {
	s := l.s
	// Check first: building the fields of a message nobody logs would
	// cost every Lock allocations.
	if ce := s.lg.Check(zap.InfoLevel, "lock granted"); ce != nil {
		ce.Write(zap.String("key", l.key), zap.Int64("token", l.token), zap.Duration("waited", waited))
	}
	if s.hooks.Acquired != nil {
		s.hooks.Acquired(l.name, l.token, waited)
	}
	l.mu.Lock()
	l.hold.grantedAt = time.Now()
	stopped := l.hold.finishedEnd
	l.mu.Unlock()
	if stopped {
		l.reportEnd()
	}
}

// finishing records that the lock is finishing, and reports the
// lock's end if it was granted.
func (l *Lock) finishing() {
	l.mu.Lock()
	l.hold.finishedEnd = true
	granted := !l.hold.grantedAt.IsZero()
	l.mu.Unlock()
	if granted {
		l.reportEnd()
	}
}

// reportEnd logs and reports how a granted lock ended. Its context has
// ended, with the reason as its cause.
func (l *Lock) reportEnd() {
	s := l.s
	why, held := context.Cause(l.ctx), time.Since(l.hold.grantedAt)
	cause := Cause(why)
	var ce *zapcore.CheckedEntry
	lost := cause != "released" && cause != "session_closed"
	if lost {
		ce = s.lg.Check(zap.WarnLevel, "lock lost")
	} else {
		ce = s.lg.Check(zap.InfoLevel, "lock released")
	}
	if ce != nil {
		fields := []zap.Field{zap.String("key", l.key), zap.Int64("token", l.token),
			zap.Duration("held", held), zap.String("cause", cause)}
		if lost {
			fields = append(fields, zap.Error(why))
		}
		ce.Write(fields...)
	}
	if s.hooks.Ended != nil {
		s.hooks.Ended(l.name, l.token, held, why)
	}
}
