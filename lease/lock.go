package lease

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/lease/internal/keywrite"
	"github.com/leasefence/leasefence/lease/internal/queue"
)

// Lock is one holding of a named lock by a Session. Its methods are safe for
// concurrent use.
//
// A Lock is held from the moment it is returned until Done is closed.
// Ownership can end at any time without the holder's help (the lease
// expires, someone deletes the key), and a paused process may not notice,
// so an open Done never proves ownership at the moment of a write. Pass
// Token to the resource and let it reject stale tokens (package fence).
type Lock struct {
	t *tracker // the key, the queue ahead and the watches that report them

	// finished (Done) comes once finish has run after the lock ended. Its
	// channel is made by the first to wait for it: a held lock that
	// nobody waits on costs none.
	finished ending

	trace *CallHooks // the acquiring call's tracing hooks; nil for none

	writing sync.Mutex // one write of the key at a time: Unlock, Resign, Proclaim

	// recorded: the lock delay's record says this writer holds the name.
	recorded atomic.Bool
	// finishRun is set by whoever runs finish, once: the one who ended the
	// lock, or the session's end (Session.endLocks).
	finishRun atomic.Bool
}

// tracker is what a lock knows of its key and of the queue ahead, and the
// watches and reads that tell it: it carries out its queue.Waiter's steps
// and feeds back what they found, and it ends the lock when that shows
// the key is no longer this holding's. Lock is the handle around it: the
// caller's API, the key's writes and the lock's end.
type tracker struct {
	s     *Session
	l     *Lock  // the handle, whose finish runs once the lock ends
	key   string // name()/lease ID in hex: the name is kept only in it
	token int64
	mode  Mode

	// end comes, with the reason as its cause, when ownership ends (Err,
	// Context); the Lock's finished channel is closed once finish has run
	// after that.
	end ending

	w *watches // the name's watches (its gate's), which deliver deletions
	// changed is poked when the keys ahead may have changed; made by the
	// lock's first wait (wait), so that a lock granted at once has none.
	changed atomic.Pointer[chan struct{}]

	mu   sync.Mutex // guards hold and q
	hold keyState
	// q decides every step of the wait (queue.Waiter), and is dropped
	// at the grant: a held lock keeps only what its end is judged by
	// (keyState), so that it costs no waiter's state.
	q *queue.Waiter
}

// keyState is the lock's key and its holding. tracker.mu guards it.
type keyState struct {
	gate  *gateEntry // the name's local gate, taken; nil once given back
	value string     // the key's value: empty for a lock, the leader's for a campaign
	// grantedAt and finishedEnd: whichever is set second reports the end.
	// grantedAt is when the grant was reported, as time since the
	// session was made (Session.born; 0 before): a third of a time.Time.
	grantedAt   time.Duration
	phase       phase
	finishedEnd bool
	granted     bool // the rule granted the lock: it is (or was) held
	// atOnce: granted on the view read with its put; alone: and nobody
	// else was queued (queue.Waiter.AtOnce, Alone), kept from the grant.
	atOnce, alone bool
	// keyEnded: an event or read of the key, once held, showed it
	// deleted or not this holding's (queue.EndsHolding).
	keyEnded bool
	// watchOwn opens the own-key watch after ownWatchDelay (grant).
	watchOwn *time.Timer
}

// phase is what the lock is doing with its key while it is held.
type phase uint8

const (
	steady          phase = iota // no release in flight
	releasing                    // an Unlock has sent its delete
	releasedOrTaken              // ... and the own-key watch saw the key go
)

// kw is the key's writes that need its marker: made for each write, as
// they keep nothing of their own, so that a held lock keeps no copy.
func (l *Lock) kw() *keywrite.Writes {
	kw := l.t.s.keyWrites(l.t.name(), l.t.key)
	return &kw
}

// name is the lock's name: its key up to the last slash, which ends the
// name (lockKey).
func (t *tracker) name() string { return t.key[:strings.LastIndexByte(t.key, '/')] }

// Name is the lock's name, as given to Lock.
func (l *Lock) Name() string { return l.t.name() }

// Key is the etcd key that holds the lock: Name()/lease ID in hex.
func (l *Lock) Key() string { return l.t.key }

// Token is the fencing token: the creation revision of the lock key. Every
// later holder of the same name has a strictly larger token, across etcd
// leader changes. Tokens of different names are unrelated.
func (l *Lock) Token() int64 { return l.t.token }

// Done is closed when ownership ends, for whatever reason (Unlock,
// Session.Close, lease expiry, deletion or replacement of the key), once
// the end has been logged and reported to the session's Hooks. A lock
// granted at once sees a deletion of its key in its first 50 ms only at
// their end (see the package doc).
func (l *Lock) Done() <-chan struct{} { return l.finished.done() }

// Err is nil while the lock is held. After Done is closed it says why:
// ErrUnlocked, ErrSessionClosed, or for an involuntary loss an error
// wrapping ErrLost (ErrLeaseExpired, ErrKeyDeleted, ErrRevisionRegressed,
// or etcd's refusal to let the session watch the key any more).
func (l *Lock) Err() error {
	return l.t.end.err()
}

// Context returns a context derived from parent, also cancelled when
// ownership ends, with the lock's Err as its cause (context.Cause), for
// work done under the lock. Call cancel when the work is done.
func (l *Lock) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	return l.t.end.link(parent)
}

// WriteContext returns a context for a fenced write made under the lock.
// It keeps parent's values and ends neither with parent nor with the lock,
// but after the session's TTL: a write under way as the lock is lost must
// still reach the resource, whose fence decides whether it counts, and no
// write outlives the lease by much. Call cancel when the write is done.
func (l *Lock) WriteContext(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), l.t.s.ttl)
}

// Lock takes the lock name, waiting until it is held or ctx ends. Locks of
// the same name taken through the same session exclude each other.
//
// A failed Lock removes its key before it returns, even if ctx has ended,
// so it may return after ctx's end: at the latest when the session ends
// (within its TTL if etcd is unreachable). If etcd refuses the delete
// outright, the key stays until the lease ends. A
// waiter whose own key or session vanishes returns at once, with an error
// wrapping ErrLost or ErrSessionClosed. A waiter whose ctx ends gets an
// error that matches ctx's error (context.DeadlineExceeded or
// context.Canceled) and names the key it was waiting behind, if any.
func (s *Session) Lock(ctx context.Context, name string) (*Lock, error) {
	return s.acquire(ctx, Call{Op: "Lock", Name: name, Mode: Write}, "", false, nil)
}

// TryLock takes the lock name if nobody holds it, and returns an error
// wrapping ErrLocked at once otherwise, naming a key ahead of it and its
// token (or saying that this same session holds or awaits it). A failed
// TryLock leaves no key behind. It writes nothing at all while the name
// has no keys under it but its queue's; with many other keys there (data,
// nested locks' keys) it may put its key and remove it again.
func (s *Session) TryLock(ctx context.Context, name string) (*Lock, error) {
	return s.acquire(ctx, Call{Op: "TryLock", Name: name, Mode: Write}, "", true, nil)
}

// acquire is the common path of Lock, TryLock, RLock, TryRLock, Campaign:
// it traces the call and names it in its error. pl, if not nil, is the
// place a Pool holds on s for the lock.
func (s *Session) acquire(ctx context.Context, c Call, value string, try bool, pl *place) (*Lock, error) {
	ctx, trace := s.hooks.call(ctx, c)
	l, err := s.take(ctx, c.Name, c.Mode, value, try, trace, pl)
	if err != nil {
		err = failed(fmt.Sprintf("%s %q", strings.ToLower(c.Op), c.Name), err)
		trace.done(0, err)
		return nil, err
	}
	trace.done(l.t.token, nil)
	return l, nil
}

// take queues the lock and waits for its turn.
func (s *Session) take(ctx context.Context, name string, mode Mode, value string, try bool, trace *CallHooks, pl *place) (*Lock, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := s.alive(); err != nil {
		return nil, err
	}
	ge, err := s.enterGate(ctx, name, try)
	if err != nil {
		return nil, err
	}
	w := &ge.v.w
	if mode == Read {
		value = ReaderValue
	}
	t := &tracker{s: s, key: w.own.Key(), mode: mode, w: w} // the key: one string per name
	t.hold.value, t.hold.gate = value, ge
	q := queue.NewWaiter(queue.NewRule(t.key, t.owns, t.blocksKV), queue.Config{
		Shared: w.shared != nil, Near: nearAhead, Follow: followKeys,
		IsReader: isReader, IsQueueKey: t.isQueueKey, IsChild: t.isChild,
	})
	t.q = &q
	l := &Lock{t: t, trace: trace}
	t.l = l
	if err := l.start(pl); err != nil {
		return nil, err
	}
	if err := l.queue(ctx, try); err != nil {
		l.end(ErrUnlocked) // its key was withdrawn or removed: see create
		return nil, err
	}
	if err := l.await(ctx, try); err != nil {
		l.abandon()
		return nil, err
	}
	if err := l.waitDelay(ctx); err != nil {
		l.abandon()
		return nil, err
	}
	l.t.restQueue()
	l.t.s.hold(l)
	l.reportGranted(time.Since(start))
	return l, nil
}

// start registers the lock with its session, whose end ends it and
// whose Close waits for it to finish, in the place pl a Pool held for it
// if any, and subscribes it to its watches. It does not wait for the
// own-key watch: a lock granted at once needs it only after
// ownWatchDelay, and a waiter opens it before it relies on its view.
func (l *Lock) start(pl *place) error {
	t := l.t
	if err := t.s.trackLock(l, pl); err != nil {
		t.end.end(err)
		l.leave()
		return err
	}
	t.listen()
	return nil
}

// finish stops the ended lock's events, hands on the gate, reports the end.
// The session stops counting the lock before Done closes (and so before
// Unlock returns), so that a Pool sees its place free at once; Close
// waits for the lock until the very end.
func (l *Lock) finish() {
	t := l.t
	defer t.s.wg.Done()     // trackLock's Add
	defer l.recordOwnLoss() // after Done has closed: the warning comes first
	defer l.finished.end(nil)
	defer t.s.untrackLock(l)
	t.stopListening()
	t.s.unhold(l)
	l.leave()
	l.finishing()
}

// Mode is Read for a holding taken by RLock or TryRLock, Write otherwise.
func (l *Lock) Mode() Mode { return l.t.mode }

// await waits for the lock's turn; with try set it only checks that no
// key is ahead (tryEmpty may have seen only keys that do not block).
func (l *Lock) await(ctx context.Context, try bool) error {
	t := l.t
	st, ended := t.look(try)
	l.reportQueued()
	switch {
	case ended:
		return t.end.err()
	case st.Kind == queue.StepHeld:
		return nil
	}
	if !try {
		t.s.hooks.waiting(t.name(), +1)
		defer t.s.hooks.waiting(t.name(), -1)
	}
	wctx, stop := l.Context(ctx)
	err := t.wait(wctx, try)
	stop()
	if err != nil && t.end.err() != nil {
		err = t.end.err()
	}
	return err
}
