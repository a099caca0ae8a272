package lease

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefence/leasefence/internal/rpcerr"
	"github.com/leasefence/leasefence/lease/internal/backoff"
)

// leave hands the name's local gate on, once.
func (l *Lock) leave() {
	t := l.t
	t.mu.Lock()
	g := t.hold.gate
	t.hold.gate = nil
	t.mu.Unlock()
	if g != nil {
		t.s.leaveGate(g)
	}
}

// abandon removes the key of a lock never handed to the caller, if it
// still carries the token, and ends the lock. With a lock delay, a record
// that it held the name becomes a release, so the next holder sees no
// loss.
func (l *Lock) abandon() {
	l.cleanup(l.abandonOps()...)
	l.end(ErrUnlocked)
}

// cleanup deletes the key, with ops, if it still carries the token,
// retrying until done or the session ends, whatever the caller's ctx: a
// key left while the session lives holds up every later waiter; the
// session's end takes it.
func (l *Lock) cleanup(ops ...clientv3.Op) {
	t := l.t
	retry := backoff.New(20*time.Millisecond, time.Second)
	then := l.removeOps(ops...)
	for {
		resp, err := t.s.keys.Txn(t.s.ctx).If(t.tokenCmp()).Then(then...).Commit()
		if err == nil {
			if resp.Succeeded {
				l.kw().Released()
			}
			return
		}
		if rpcerr.Refused(err) {
			// Refused outright (no permission, say): retrying changes nothing.
			t.s.lg.Error("lock key left until this session's next lock of the name or its end",
				zap.String("key", t.key), zap.Error(err))
			return
		}
		if retry.Wait(t.s.ctx) != nil {
			t.s.lg.Debug("lock key left for the ended session's lease to remove", zap.String("key", t.key), zap.Error(err))
			return
		}
	}
}

// removeOps delete the holding's key, and its marker unless it is kept
// (keywrite.Writes.ReleaseOps), then do ops: cleanup's and Unlock's Then,
// under tokenCmp. Once they applied, keywrite.Writes.Released records it.
func (l *Lock) removeOps(ops ...clientv3.Op) []clientv3.Op {
	return append(append([]clientv3.Op{clientv3.OpDelete(l.t.key)}, l.kw().ReleaseOps()...), ops...)
}

// tokenCmp holds while the key is this holding's: a later holding of the
// session has a later creation revision.
func (t *tracker) tokenCmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.token)
}

// Unlock releases the lock: it deletes the key only if the key's creation
// revision is still the token, so it never removes a later holder's key,
// even when a retry arrives late. Done then closes and Err is ErrUnlocked.
//
// If the lock has already ended, Unlock sends nothing and returns an error
// saying how: wrapping ErrUnlocked, ErrSessionClosed or ErrLost. If the key
// was found gone or replaced, the error wraps ErrKeyDeleted. If Unlock
// returns etcd's error (no answer, or ctx ended), the lock is still
// considered held, and Unlock may be called again.
func (l *Lock) Unlock(ctx context.Context) error {
	ctx, done := l.traceRelease(ctx, "Unlock")
	err := l.unlock(ctx)
	if err != nil {
		err = failed(fmt.Sprintf("unlock %q", l.t.name()), err)
	}
	done(err)
	return err
}

func (l *Lock) unlock(ctx context.Context) error {
	t := l.t
	l.writing.Lock()
	defer l.writing.Unlock()
	if t.end.err() != nil {
		// Ended already: once finish has run, the name's gate is free,
		// so a Lock of the name right after this call is not refused.
		<-l.finished.done()
		return t.end.err()
	}
	l.setPhase(releasing)
	rested := t.restOwn()
	resp, err := t.s.keys.Txn(ctx).
		If(t.tokenCmp()).
		Then(l.removeOps(l.releaseOps()...)...).
		Commit()
	if err == nil && resp.Succeeded {
		l.kw().Released()
	}

	t.mu.Lock()
	released := (err == nil && resp.Succeeded) || (err != nil && t.hold.phase == releasedOrTaken)
	finishHere := false
	if released {
		// Before the phase goes back: the own-key watch may see our own delete
		// at any moment after, and must not call it a loss.
		finishHere = l.cancelWith(ErrUnlocked)
	}
	t.hold.phase = steady
	t.mu.Unlock()
	switch {
	case released:
		l.finishOrWait(finishHere)
		return nil
	case err == nil:
		l.end(ErrKeyDeleted)
		return ErrKeyDeleted
	default:
		if rested {
			// Still held, perhaps: its key's deletion must be heard.
			t.w.own.Resume()
		}
		return err
	}
}

// put sets the key's value, guarded by its creation revision and lease: it
// never creates a key, touches a successor's, or puts back on the lease a
// key someone moved off it (which ended the holding). A key found gone or
// moved ends the lock.
func (l *Lock) put(ctx context.Context, value string) error {
	t := l.t
	l.writing.Lock()
	defer l.writing.Unlock()
	if t.end.err() != nil {
		// Ended already: once finish has run, the name's gate is free,
		// so a Lock of the name right after this call is not refused.
		<-l.finished.done()
		return t.end.err()
	}
	resp, err := t.s.client.Txn(ctx).
		If(t.heldCmps()...).
		Then(clientv3.OpPut(t.key, value, clientv3.WithLease(t.s.id))).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		l.end(ErrKeyDeleted)
		return t.end.err()
	}
	t.mu.Lock()
	t.hold.value = value
	t.mu.Unlock()
	return nil
}

// heldCmps are the comparisons that hold while the key is this holding's:
// its creation revision is the token and it is on the session's lease.
func (t *tracker) heldCmps() []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.token),
		clientv3.Compare(clientv3.LeaseValue(t.key), "=", int64(t.s.id)),
	}
}

// currentValue is the value the key was last given.
func (l *Lock) currentValue() string {
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hold.value
}

func (l *Lock) setPhase(p phase) {
	t := l.t
	t.mu.Lock()
	t.hold.phase = p
	t.mu.Unlock()
}

// end ends the lock with cause and waits for it to finish.
func (l *Lock) end(cause error) {
	l.finishOrWait(l.cancelWith(cause))
}

// cancelWith ends the lock's context and reports whether finish is left
// to the caller: it saves a goroutine and a wake-up on every release.
func (l *Lock) cancelWith(cause error) (finishHere bool) {
	finishHere = l.finishRun.CompareAndSwap(false, true)
	l.t.end.end(cause)
	return finishHere
}

// finishLater runs finish on a goroutine of its own once the lock's
// context has ended, unless someone runs it already. Session.Close waits
// for it (trackLock).
func (l *Lock) finishLater() {
	if l.finishRun.CompareAndSwap(false, true) {
		go l.finish()
	}
}

// finishOrWait runs finish if left to the caller, or waits for it.
func (l *Lock) finishOrWait(finishHere bool) {
	if finishHere {
		l.finish()
		return
	}
	<-l.finished.done()
}
