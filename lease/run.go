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

// Run holds the lock name for as long as fn works, and takes it again
// after a loss: the supervised form of NewSession (with opts), Lock and
// Unlock. It calls fn with the Lock and a context that ends when the lock
// or ctx ends (for a fenced write, use Lock.WriteContext instead). fn is
// never called twice at once.
//
//   - fn returns while the lock is held: Run releases the lock, closes the
//     session and returns an error wrapping fn's, or else the error of a
//     failed release, or nil.
//   - The lock is lost (also if fn failed and the release finds the key
//     gone): whatever fn returned, Run waits a jittered backoff of at most
//     2 s, takes the lock again and calls fn with the new Lock, whose
//     token is larger. fn must resume from the state its fence protects,
//     and read it first with a claim of its token (fence.Claim, sqlfence's
//     Claim): a plain read can come before a write the previous holder had
//     in flight.
//   - ctx ends: Run waits for fn, releases the lock, closes the session
//     and returns an error wrapping ctx's cause.
//
// Bad input gives an error wrapping ErrInvalidArgument before anything is
// sent. ErrKeyInUse, ErrTLSHandshake, or a request etcd refuses outright
// (no permission, not authenticated), ends Run; any other failure is
// retried.
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
// fn while leading, and campaigns again after a loss, on Run's terms.
func Lead(ctx context.Context, client *clientv3.Client, name, value string,
	fn func(ctx context.Context, l *Leadership) error, opts ...Option) error {
	if fn == nil {
		return failed(fmt.Sprintf("lead %q", name), fmt.Errorf("%w: nil func", ErrInvalidArgument))
	}
	if err := leaderValue(value); err != nil {
		return failed(fmt.Sprintf("lead %q", name), err)
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
	unlock(ctx context.Context) error
}

func (e *Leadership) unlock(ctx context.Context) error { return e.l.unlock(ctx) }

// Backoff between holdings, each wait drawn from the upper half of a
// doubling delay, so that holders that lost together do not return in step.
const (
	runRetryFirst = 100 * time.Millisecond
	runRetryMax   = 2 * time.Second
)

// supervise is Run and Lead: take, call fn, start over after a loss.
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
		if s, err = liveSession(ctx, client, s, opts); err == nil {
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

// liveSession returns s if it is alive, or a new session in its place.
func liveSession(ctx context.Context, client *clientv3.Client, s *Session, opts []Option) (*Session, error) {
	if s != nil && s.Err() == nil {
		return s, nil
	}
	if s != nil {
		s.Close() // it has ended already: Close only stops its goroutines
	}
	return NewSession(ctx, client, opts...)
}

// holdOnce takes the holding and calls fn. done means Run is over, with
// result err; else the holding was lost (err nil) or not taken.
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
		// fn may have failed because the holding was lost unnoticed (a
		// write refused as stale): the release then finds it a loss.
		if errors.Is(releaseAfter(s, h), ErrLost) {
			return false, nil
		}
		return true, ferr
	}
	// fn finished; a key gone at release changes nothing fn did under fences.
	if err := releaseAfter(s, h); err != nil && !errors.Is(err, ErrLost) {
		return true, err
	}
	return true, nil
}

// releaseAfter releases h within the TTL, not ctx, which may have ended fn.
func releaseAfter(s *Session, h holding) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.TTL())
	defer cancel()
	return h.unlock(ctx)
}

// retryable tells whether to try again: not after ctx ended or a refusal.
func retryable(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil:
		return false
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrKeyInUse), errors.Is(err, ErrTLSHandshake):
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
