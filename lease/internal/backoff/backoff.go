// Package backoff is a doubling delay between retries, capped.
package backoff

import (
	"context"
	"time"
)

// Backoff is a doubling delay between retries, capped at max.
type Backoff struct {
	first, max, next time.Duration
}

// New starts a Backoff at first, doubling up to max.
func New(first, max time.Duration) Backoff {
	return Backoff{first: first, max: max, next: first}
}

// Wait sleeps the current delay and doubles it, or returns ctx's cause.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.next)
	defer t.Stop()
	b.next = min(2*b.next, b.max)
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Reset starts the delays over, after a success.
func (b *Backoff) Reset() { b.next = b.first }

// Next returns the current delay and doubles it, for a caller that waits
// on a timer of its own.
func (b *Backoff) Next() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}
