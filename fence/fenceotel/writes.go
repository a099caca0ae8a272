package fenceotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasefence/leasefence/fence"
)

// write is fence.Hooks.Write. A commit through etcd, SQL or an object
// store gets a span of its own, a child of ctx's; a request checked by
// fencehttp or fencegrpc marks the server span that ctx carries (from
// otelhttp or otelgrpc) instead.
func (t *Telemetry) write(ctx context.Context, w fence.Write) (context.Context, func(error)) {
	if w.Fence == "http" || w.Fence == "grpc" {
		span := trace.SpanFromContext(ctx)
		if !span.IsRecording() {
			return ctx, nil
		}
		return ctx, func(err error) { markRequest(span, w, err) }
	}
	sctx, span := t.tracer.Start(ctx, writeSpanName(w), trace.WithSpanKind(trace.SpanKindInternal))
	if !span.IsRecording() {
		return ctx, nil
	}
	span.SetAttributes(writeAttrs(w)...)
	return sctx, func(err error) {
		verdict(span, err)
		span.End()
	}
}

// writeSpanName names a fenced write's span after the call that made it.
func writeSpanName(w fence.Write) string {
	claim := len(w.Guards) > 0 && w.Guards[0].Kind == "claim"
	switch {
	case w.Fence == "etcd":
		return "fence.Txn.Commit"
	case w.Fence == "sql" && claim:
		return "sqlfence.Claim"
	case w.Fence == "sql":
		return "sqlfence.Write"
	case w.Fence == "object" && claim:
		return "objectfence.Claim"
	case w.Fence == "object":
		return "objectfence.Commit"
	}
	return "fence.Write"
}

func writeAttrs(w fence.Write) []attribute.KeyValue {
	kinds := make([]string, len(w.Guards))
	keys := make([]string, len(w.Guards))
	tokens := make([]int64, len(w.Guards))
	for i, g := range w.Guards {
		kinds[i], keys[i], tokens[i] = g.Kind, g.Key, g.Token
	}
	return []attribute.KeyValue{AttrFence.String(w.Fence), AttrGuards.StringSlice(kinds),
		AttrKeys.StringSlice(keys), AttrTokens.Int64Slice(tokens)}
}

// markRequest puts a fenced request's lock, token and verdict on its
// server span; a refusal sets the span's status to Error.
func markRequest(span trace.Span, w fence.Write, err error) {
	if len(w.Guards) > 0 {
		g := w.Guards[0]
		span.SetAttributes(AttrFence.String(w.Fence), AttrGuards.StringSlice([]string{g.Kind}))
		if g.Key != "" {
			span.SetAttributes(AttrLockName.String(g.Key), AttrToken.Int64(g.Token))
		}
	}
	verdict(span, err)
	if err != nil {
		span.AddEvent("refused", trace.WithAttributes(AttrVerdict.String(writeOutcome(err))))
	}
}

// verdict records a write's outcome; a stale one names both tokens.
func verdict(span trace.Span, err error) {
	outcome := writeOutcome(err)
	span.SetAttributes(AttrVerdict.String(outcome))
	if err == nil {
		return
	}
	var se *fence.StaleError
	if errors.As(err, &se) {
		span.SetAttributes(AttrToken.Int64(se.Token), AttrHighest.Int64(se.Highest))
	}
	span.SetAttributes(AttrErrorType.String(outcome))
	span.SetStatus(codes.Error, err.Error())
}

// writeOutcome names a fenced write's verdict.
func writeOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, fence.ErrStale):
		return "stale"
	case errors.Is(err, fence.ErrUnverified):
		return "unverified"
	case errors.Is(err, fence.ErrNotHeld):
		return "not_held"
	case errors.Is(err, fence.ErrOutcomeUnknown):
		return "unknown"
	case errors.Is(err, fence.ErrInvalidArgument):
		return "invalid"
	}
	return "error"
}
