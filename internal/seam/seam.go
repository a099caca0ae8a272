// Package seam carries test-only switches into the library: deliberate
// bugs (mutants) that the fault suite must catch, and a local clock that
// runs slow or fast. They travel in a context value whose key only this
// module can build, so no user of the library can set them, and a context
// without them (every user's) takes the ordinary code paths.
package seam

import "context"

// Mutant is a deliberate bug.
type Mutant int

// The mutants. Each names what the library does wrong while it is on.
const (
	None Mutant = iota
	// NoFenceCompare: fence and sqlfence write without comparing tokens.
	NoFenceCompare
	// LeaseIDToken: Lock.Token returns the lease ID.
	LeaseIDToken
	// HeaderRevisionToken: Lock.Token returns the revision of the response
	// that granted the lock, as etcdctl lock's ETCD_LOCK_REV does.
	HeaderRevisionToken
	// UnguardedUnlock: Unlock deletes the key by name, with no revision
	// guard and even after the lock has ended, as concurrency.Mutex does.
	UnguardedUnlock
	// SessionOnlyOwnership: a lock counts as held while its session lives;
	// neither the waiter nor the holder checks its own key.
	SessionOnlyOwnership
	// RequestedTTL: the session uses the TTL it asked for, not the one etcd
	// granted.
	RequestedTTL
)

// Mutants lists every mutant, for tests that go through them all.
func Mutants() []Mutant {
	return []Mutant{NoFenceCompare, LeaseIDToken, HeaderRevisionToken, UnguardedUnlock, SessionOnlyOwnership, RequestedTTL}
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
	}
	return "unknown mutant"
}

// Hooks are the switches one context carries.
type Hooks struct {
	Mutant Mutant
	// ClockRate scales the library's local clock: 0.5 runs it at half
	// speed (deadlines fire late), 2 at double (early). 0 means real time.
	ClockRate float64
}

type ctxKey struct{}

// With returns ctx carrying h.
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
