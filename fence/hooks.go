package fence

import (
	"context"
	"errors"
)

// Hooks receive the verdicts of fenced writes, for metrics and traces. Every
// field is optional; the functions must be safe for concurrent use and
// quick. Package fence/fenceprom turns them into Prometheus counters,
// fence/fenceotel into OpenTelemetry spans and metrics. Give them to
// Txn.WithHooks, sqlfence.WithHooks, objectfence.WithHooks,
// fencehttp.WithHooks or fencegrpc.WithHooks.
type Hooks struct {
	// Refused is called when a fence refuses a write for a stale token
	// or one etcd did not confirm, with the kind of guard that refused it: "held", "resource", "sql", "object", "http"
	// or "grpc".
	Refused func(guard string)
	// OutcomeUnknown is called when a fenced write may or may not have
	// been applied (ErrOutcomeUnknown).
	OutcomeUnknown func()
	// Write is called as a fence takes a write, with the write's context
	// and its guards, for tracing. The write goes on with the context it
	// returns, which must be ctx or derived from it (nil means ctx). The
	// function it returns (nil for none) is called once with the verdict:
	// nil if the write was accepted, else its error (a *StaleError names
	// both tokens). fencehttp and fencegrpc call it once their check is
	// made, with the request's context, and call the function at once.
	Write func(ctx context.Context, w Write) (context.Context, func(err error))
}

// Write describes a fenced write to Hooks.Write.
type Write struct {
	// Fence is what checks it: "etcd" (Txn), "sql", "object", "http" or
	// "grpc".
	Fence string
	// Guards are its guards, in the order given.
	Guards []WriteGuard
}

// WriteGuard is one guard of a Write.
type WriteGuard struct {
	// Kind is "held" or "resource" for Txn's guards; "claim" for a claim
	// (Claim, sqlfence's and objectfence's Claim, a claim over HTTP or
	// gRPC); "row" for another sqlfence write, "manifest" for an
	// objectfence Commit, "token" for another fenced request.
	Kind string
	// Key is what the token is checked against: the lock key (held), the
	// record key, the table and id, the manifest key, or the lock name for
	// a request.
	Key   string
	Token int64
}

// Report calls the hook that err calls for, if any: Refused with guard for a
// *StaleError or an *UnverifiedError, Refused("held") for a *NotHeldError, OutcomeUnknown for
// ErrOutcomeUnknown. It is nil-safe, for the fence packages that report
// through it.
func (h *Hooks) Report(guard string, err error) {
	switch {
	case h == nil || err == nil:
	case errors.Is(err, ErrNotHeld):
		if h.Refused != nil {
			h.Refused("held")
		}
	case errors.Is(err, ErrStale), errors.Is(err, ErrUnverified):
		if h.Refused != nil {
			h.Refused(guard)
		}
	case errors.Is(err, ErrOutcomeUnknown):
		if h.OutcomeUnknown != nil {
			h.OutcomeUnknown()
		}
	}
}

// Begin starts a fenced write for the hooks: it calls Write, if set, with
// what guards builds, and returns the context the write goes on with and
// the function that takes its verdict, which calls Write's function and
// Report(guard, err). It is nil-safe, for the fence packages; guards is
// called only when Write is set.
func (h *Hooks) Begin(ctx context.Context, fence, guard string, guards func() []WriteGuard) (context.Context, func(error)) {
	if h == nil {
		return ctx, func(error) {}
	}
	var verdict func(error)
	if h.Write != nil {
		var wctx context.Context
		wctx, verdict = h.Write(ctx, Write{Fence: fence, Guards: guards()})
		if wctx != nil {
			ctx = wctx
		}
	}
	return ctx, func(err error) {
		if verdict != nil {
			verdict(err)
		}
		h.Report(guard, err)
	}
}

// Checked tells the Write hook, if set, of a fenced request already
// checked, with its verdict; it does not call Report. It is nil-safe, for
// fencehttp and fencegrpc, whose requests are checked before the handler
// runs and whose spans are the server's.
func (h *Hooks) Checked(ctx context.Context, fence string, g WriteGuard, err error) {
	if h == nil || h.Write == nil {
		return
	}
	_, verdict := h.Write(ctx, Write{Fence: fence, Guards: []WriteGuard{g}})
	if verdict != nil {
		verdict(err)
	}
}

// RequestGuard is the WriteGuard of a fenced request under c: a "claim"
// if claim is set, else a "token".
func RequestGuard(name string, token int64, claim bool) WriteGuard {
	if claim {
		return WriteGuard{Kind: "claim", Key: name, Token: token}
	}
	return WriteGuard{Kind: "token", Key: name, Token: token}
}
