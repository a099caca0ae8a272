package fenceotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasefence/leasefence/lease"
)

// SpanHoldingEnd names the span of a holding that ended other than by an
// Unlock or Resign. The other spans are named after the calls that make
// them (see the package documentation).
const SpanHoldingEnd = "lease.HoldingEnd"

// call is one acquiring call's span and what its holding's end needs.
type call struct {
	t     *Telemetry
	span  trace.Span
	attrs []attribute.KeyValue // name and mode

	mu       sync.Mutex
	queuedAt time.Time
	release  *releaseSpan // the open span of an Unlock or Resign of the holding
}

// releaseSpan is an Unlock's or Resign's span, held by pointer: spans
// are interfaces whose dynamic types need not be comparable (an
// unsampled remote parent's is not), so they are never compared.
type releaseSpan struct{ trace.Span }

// call is lease.Hooks.Call: a span for the call, a child of ctx's.
func (t *Telemetry) call(ctx context.Context, c lease.Call) (context.Context, *lease.CallHooks) {
	sctx, span := t.tracer.Start(ctx, "lease."+c.Op, trace.WithSpanKind(trace.SpanKindInternal))
	if !span.IsRecording() {
		// Sampled out or no SDK: nothing to say, and no end span to link.
		// The call goes on with ctx, which carries what a child would.
		return ctx, nil
	}
	attrs := []attribute.KeyValue{AttrLockName.String(c.Name), AttrMode.String(c.Mode.String())}
	span.SetAttributes(attrs...)
	cl := &call{t: t, span: span, attrs: attrs}
	return sctx, &lease.CallHooks{Queued: cl.queued, Done: cl.done, Release: cl.startRelease, Ended: cl.ended}
}

func (c *call) queued(ahead int) {
	now := time.Now()
	c.mu.Lock()
	c.queuedAt = now
	c.mu.Unlock()
	c.span.AddEvent("queued", trace.WithTimestamp(now), trace.WithAttributes(AttrAhead.Int(ahead)))
	c.span.SetAttributes(AttrAhead.Int(ahead))
}

func (c *call) done(token int64, err error) {
	c.mu.Lock()
	queuedAt := c.queuedAt
	c.mu.Unlock()
	if !queuedAt.IsZero() {
		c.span.SetAttributes(AttrQueueTime.Float64(time.Since(queuedAt).Seconds()))
	}
	outcome := lockOutcome(err)
	c.span.SetAttributes(AttrOutcome.String(outcome))
	switch {
	case err == nil:
		c.span.SetAttributes(AttrToken.Int64(token))
	case outcome == "locked":
		// A TryLock that finds the lock taken did what it is for.
	default:
		c.span.SetAttributes(AttrErrorType.String(outcome))
		c.span.SetStatus(codes.Error, err.Error())
	}
	c.span.End()
}

// startRelease is the span of an Unlock or Resign: a child of its caller's
// context, linked to the acquiring call's span.
func (c *call) startRelease(ctx context.Context, op string) (context.Context, *lease.CallHooks) {
	ctx, span := c.t.tracer.Start(ctx, "lease."+op, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(c.attrs...), trace.WithLinks(trace.Link{SpanContext: c.span.SpanContext()}))
	rel := &releaseSpan{span}
	c.mu.Lock()
	c.release = rel
	c.mu.Unlock()
	return ctx, &lease.CallHooks{Done: func(token int64, err error) {
		c.mu.Lock()
		if c.release == rel {
			c.release = nil
		}
		c.mu.Unlock()
		span.SetAttributes(AttrToken.Int64(token))
		if err != nil {
			span.SetAttributes(AttrErrorType.String(lockOutcome(err)))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}}
}

// ended records the holding's end: an event on the Unlock or Resign span
// that ended it, or else a span of its own, linked to the acquisition's.
func (c *call) ended(held time.Duration, why error) {
	cause := lease.Cause(why)
	attrs := []attribute.KeyValue{AttrCause.String(cause), AttrHeld.Float64(held.Seconds())}
	c.mu.Lock()
	release := c.release
	c.mu.Unlock()
	if release != nil && cause == "released" {
		release.AddEvent("ended", trace.WithAttributes(attrs...))
		release.SetAttributes(attrs...)
		return
	}
	_, span := c.t.tracer.Start(context.Background(), SpanHoldingEnd, trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(c.attrs...),
		trace.WithAttributes(attrs...), trace.WithLinks(trace.Link{SpanContext: c.span.SpanContext()}))
	if cause != "released" && cause != "session_closed" {
		span.SetAttributes(AttrErrorType.String(cause))
		span.SetStatus(codes.Error, why.Error())
	}
	span.End()
}

// lockOutcome names how a lock call ended, for spans.
func lockOutcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, lease.ErrLocked):
		return "locked"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, lease.ErrSessionClosed):
		return "session_closed"
	case errors.Is(err, lease.ErrLost):
		return "lost"
	case errors.Is(err, lease.ErrUnlocked):
		return "released"
	case errors.Is(err, lease.ErrInvalidArgument):
		return "invalid"
	}
	return "error"
}
