package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/internal/rpcerr"
)

// Run holds the lock name for as long as fn works, and takes it again when
// it is lost: the supervised form of NewSession, Lock and Unlock.
//
// Run creates a session (opts are NewSession's), takes the lock and calls
// fn with the Lock, for its token, and a context that ends when the lock
// ends or ctx ends. Use that context to wait and to stop work; for a fenced
// write use Lock.WriteContext, so that a write under way when the lock is
// lost still reaches the resource and gets its verdict (a
// *fence.StaleError) rather than being cancelled into an unknown outcome.
//
//   - fn returns nil while the lock is still held: Run releases the lock,
//     closes its session and returns nil.
//   - fn returns an error while the lock is still held: Run releases the
//     lock, closes its session and returns an error wrapping fn's. If the
//     release finds the key gone (fn failed because the lock had been lost
//     before this process noticed, say a write refused as stale), that is
//     a loss, as below.
//   - The lock is lost (its key deleted, its lease expired or revoked):
//     whatever fn returned, Run waits a short jittered backoff (at most
//     2 s), takes the lock again, on a new session if the old one ended,
//     and calls fn again with the new Lock, whose token is larger. fn must
//     therefore resume from the state its fence protects, not from memory.
//
// fn's first read of that state should be a claim made with its token
// (fence.Claim in the read's etcd transaction, sqlfence's Claim in the
// read's SQL transaction, a fencehttp claim request), not a plain read.
// Until fn's first write raises the fence, a write the previous holder
// still had in flight passes it, and could land after fn's plain read,
// leaving fn to build on a state that has since changed.
//   - ctx ends: fn's context ends, Run waits for fn, releases the lock,
//     closes the session and returns an error wrapping ctx's error.
//
// Bad input (a nil client or fn, a bad name or option) gives an error
// wrapping ErrInvalidArgument before anything is sent, and fn is never
// called. A request etcd refuses outright (no permission, not
// authenticated) ends Run with that error; a transient failure (no leader,
// a lost connection) is retried with the same backoff.
//
// Run blocks until it returns. fn is never called twice at once.
func Run(ctx context.Context, client *clientv3.Client, name string,
	fn func(ctx context.Context, l *Lock) error, opts ...Option) error {
	if fn == nil {
		return failed(fmt.Sprintf("run %q", name), fmt.Errorf("%w: nil func", ErrInvalidArgument))
	}
	take := func(ctx context.Context, s *Session) (*Lock, error) { return s.Lock(ctx, name) }
	if err := supervise(ctx, client, name, opts, take, fn); err != nil {
		return failed(fmt.Sprintf("run %q", name), err)
	}
	return nil
}

// Lead is Run for leader election: it campaigns for name with value, calls
// fn while leading, and campaigns again when the leadership is lost, on
// the same terms as Run (Resign instead of Unlock).
func Lead(ctx context.Context, client *clientv3.Client, name, value string,
	fn func(ctx context.Context, l *Leadership) error, opts ...Option) error {
	if fn == nil {
		return failed(fmt.Sprintf("lead %q", name), fmt.Errorf("%w: nil func", ErrInvalidArgument))
	}
	take := func(ctx context.Context, s *Session) (*Leadership, error) { return s.Campaign(ctx, name, value) }
	if err := supervise(ctx, client, name, opts, take, fn); err != nil {
		return failed(fmt.Sprintf("lead %q", name), err)
	}
	return nil
}

// holding is what supervise needs of a Lock or a Leadership.
type holding interface {
	Err() error
	Context(parent context.Context) (context.Context, context.CancelFunc)
	release(ctx context.Context) error
}

func (l *Lock) release(ctx context.Context) error       { return l.unlock(ctx) }
func (e *Leadership) release(ctx context.Context) error { return e.l.unlock(ctx) }

// Backoff between holdings: doubling from runRetryFirst to runRetryMax,
// each wait drawn at random from its upper half, so that many holders that
// lost their locks together do not come back in step.
const (
	runRetryFirst = 100 * time.Millisecond
	runRetryMax   = 2 * time.Second
)

// supervise is Run and Lead: take the holding, call fn, and start over
// when the holding is lost.
func supervise[H holding](ctx context.Context, client *clientv3.Client, name string, opts []Option,
	take func(context.Context, *Session) (H, error), fn func(context.Context, H) error) error {
	if client == nil {
		return errNilClient
	}
	if err := validateName(name); err != nil {
		return err
	}
	if _, err := buildOptions(opts); err != nil {
		return err
	}
	var s *Session
	defer func() {
		if s != nil {
			s.Close() // if the revoke fails, the lease expires
		}
	}()
	delay := runRetryFirst
	for {
		var err error
		if s, err = renew(ctx, client, s, opts); err == nil {
			var done bool
			if done, err = holdOnce(ctx, s, take, fn); done {
				return err
			}
			if err == nil {
				delay = runRetryFirst // it was held: start the backoff over
			}
		}
		if err != nil && !retryable(ctx, err) {
			return err
		}
		if err := pause(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, runRetryMax)
	}
}

// renew returns s if it is alive, or a new session in its place.
func renew(ctx context.Context, client *clientv3.Client, s *Session, opts []Option) (*Session, error) {
	if s != nil && s.Err() == nil {
		return s, nil
	}
	if s != nil {
		s.Close() // it has ended already: Close only stops its goroutines
	}
	return NewSession(ctx, client, opts...)
}

// holdOnce takes the holding and calls fn. done reports that Run is over,
// with err its result; otherwise the holding was lost (err nil) or could
// not be taken (err says why) and Run goes on.
func holdOnce[H holding](ctx context.Context, s *Session, take func(context.Context, *Session) (H, error),
	fn func(context.Context, H) error) (done bool, err error) {
	h, err := take(ctx, s)
	if err != nil {
		return false, err
	}
	fctx, cancel := h.Context(ctx)
	ferr := fn(fctx, h)
	cancel()
	switch {
	case ctx.Err() != nil:
		releaseAfter(s, h)
		return true, context.Cause(ctx)
	case h.Err() != nil:
		return false, nil // lost: take it again, whatever fn said
	case ferr != nil:
		// fn may have failed because the holding was lost before this
		// process noticed (a write refused as stale): the release finds
		// the key gone, and it is a loss like any other.
		if errors.Is(releaseAfter(s, h), ErrLost) {
			return false, nil
		}
		return true, ferr
	}
	// fn finished its work; a key found gone at release changes nothing
	// of what it did under its fences.
	if err := releaseAfter(s, h); err != nil && !errors.Is(err, ErrLost) {
		return true, err
	}
	return true, nil
}

// releaseAfter releases h with a deadline of its own (ctx may be what
// ended fn), bounded by the TTL: past it the lease has expired anyway.
func releaseAfter(s *Session, h holding) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.TTL())
	defer cancel()
	return h.release(ctx)
}

// retryable tells whether a failed session or acquisition is worth trying
// again: not once ctx has ended, and not when etcd refused outright.
func retryable(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil:
		return false
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrKeyInUse):
		return false
	case errors.Is(err, ErrLost), errors.Is(err, ErrSessionClosed):
		return true
	}
	return !rpcerr.Definite(err)
}

// pause waits a random time in [d/2, d], or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
