package lease

import (
	"context"
	"time"
)

// backoff is a doubling delay between retries, capped at max.
type backoff struct {
	first, max, next time.Duration
}

func newBackoff(first, max time.Duration) backoff {
	return backoff{first: first, max: max, next: first}
}

// wait sleeps the current delay and doubles it, or returns ctx's cause.
func (b *backoff) wait(ctx context.Context) error {
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

// reset starts the delays over, after a success.
func (b *backoff) reset() { b.next = b.first }
