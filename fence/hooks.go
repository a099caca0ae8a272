package fence

import "errors"

// Hooks receive the verdicts of fenced writes, for metrics. Every field is
// optional; the functions must be safe for concurrent use and quick. Package
// fence/fenceprom turns them into Prometheus counters. Give them to
// Txn.WithHooks, sqlfence.WithHooks, fencehttp.WithHooks or
// fencegrpc.WithHooks.
type Hooks struct {
	// Refused is called when a fence refuses a write, with the kind of
	// guard that refused it: "held", "resource", "sql", "http" or "grpc".
	Refused func(guard string)
	// OutcomeUnknown is called when a fenced write may or may not have
	// been applied (ErrOutcomeUnknown).
	OutcomeUnknown func()
}

// Report calls the hook that err calls for, if any: Refused with guard for a
// *StaleError, Refused("held") for a *NotHeldError, OutcomeUnknown for
// ErrOutcomeUnknown. It is nil-safe, for the fence packages that report
// through it.
func (h *Hooks) Report(guard string, err error) {
	switch {
	case h == nil || err == nil:
	case errors.Is(err, ErrNotHeld):
		if h.Refused != nil {
			h.Refused("held")
		}
	case errors.Is(err, ErrStale):
		if h.Refused != nil {
			h.Refused(guard)
		}
	case errors.Is(err, ErrOutcomeUnknown):
		if h.OutcomeUnknown != nil {
			h.OutcomeUnknown()
		}
	}
}
