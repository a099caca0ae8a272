// Package seam names the fault suite's deliberate bugs (mutants) and
// builds the ones that can live outside the library: a KV and an SQL
// executor that drop the fence's comparisons, a token reported wrongly, an
// Unlock by key name. The mutants that live inside package lease's own
// checks exist only under the build tag leasefence_mutants, as options of
// that package (lease.WithMutant, lease.WithClockRate); a release build of
// the library imports nothing from here.
//
// The suite carries the switches of one run through its own code in a
// context value (With, From); the library never reads them from a context.
package seam

import "context"

// Mutant is a deliberate bug.
type Mutant int

// The mutants. Each names what the library does wrong while it is on.
const (
	None Mutant = iota
	// NoFenceCompare: fence and sqlfence write without comparing tokens
	// (KV and Execer here).
	NoFenceCompare
	// LeaseIDToken: the token reported is the lease ID (ReportedToken).
	LeaseIDToken
	// HeaderRevisionToken: the token reported is the revision of a response
	// read after the grant, as etcdctl lock's ETCD_LOCK_REV is
	// (ReportedToken).
	HeaderRevisionToken
	// UnguardedUnlock: Unlock deletes the key by name, with no revision
	// guard and even after the lock has ended, as concurrency.Mutex does
	// (Unlock here).
	UnguardedUnlock
	// SessionOnlyOwnership: a lock counts as held while its session lives;
	// neither the waiter nor the holder checks its own key (inside lease).
	SessionOnlyOwnership
	// RequestedTTL: the session uses the TTL it asked for, not the one etcd
	// granted (inside lease).
	RequestedTTL
	// DroppedWake: a waiter is not woken when a watch delivers news of
	// its queue, so it sleeps on past its turn until something else wakes
	// it or its context ends (inside lease).
	DroppedWake
)

// Mutants lists every mutant, for tests that go through them all.
func Mutants() []Mutant {
	return []Mutant{NoFenceCompare, LeaseIDToken, HeaderRevisionToken, UnguardedUnlock, SessionOnlyOwnership, RequestedTTL, DroppedWake}
}

func (m Mutant) String() string {
	switch m {
	case None:
		return "none"
	case NoFenceCompare:
		return "fence comparison removed"
	case LeaseIDToken:
		return "lease ID as token"
	case HeaderRevisionToken:
		return "header revision as token"
	case UnguardedUnlock:
		return "unguarded Unlock"
	case SessionOnlyOwnership:
		return "ownership from Session.Done alone"
	case RequestedTTL:
		return "requested TTL instead of granted"
	case DroppedWake:
		return "a wake-up dropped"
	}
	return "unknown mutant"
}

// InLease tells whether m lives inside package lease's checks, and so
// needs the leasefence_mutants build tag.
func (m Mutant) InLease() bool {
	return m == SessionOnlyOwnership || m == RequestedTTL || m == DroppedWake
}

// Hooks are the switches of one run of the suite.
type Hooks struct {
	Mutant Mutant
	// ClockRate scales the library's local clock: 0.5 runs it at half
	// speed (deadlines fire late), 2 at double (early). 0 means real time.
	ClockRate float64
}

type ctxKey struct{}

// With returns ctx carrying h, for the suite's own code.
func With(ctx context.Context, h *Hooks) context.Context { return context.WithValue(ctx, ctxKey{}, h) }

// From returns the hooks ctx carries, nil if none.
func From(ctx context.Context) *Hooks {
	h, _ := ctx.Value(ctxKey{}).(*Hooks)
	return h
}

// On returns the mutant that is on; None for nil hooks.
func (h *Hooks) On() Mutant {
	if h == nil {
		return None
	}
	return h.Mutant
}

// Has tells whether mutant m is on. It is false for nil hooks.
func (h *Hooks) Has(m Mutant) bool { return h != nil && h.Mutant == m }
