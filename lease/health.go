package lease

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Health is a readiness or liveness check for a service that holds locks.
// It fails once a tracked lock is lost, or its session has gone longer
// than the margin without a renewal. It is a signal, never a guarantee: a
// paused process answers no probe. It is safe for concurrent use; Check
// and ServeHTTP send nothing.
type Health struct {
	margin time.Duration
	mu     sync.Mutex
	locks  map[string]*Lock // by name
}

// NewHealth returns a check with renewal margin margin. Sessions renew
// every third of their TTL, so a margin between a third and two thirds of
// the TTL warns before the lease can expire. A margin of zero or less is
// refused with ErrInvalidArgument.
func NewHealth(margin time.Duration) (*Health, error) {
	if margin <= 0 {
		return nil, fmt.Errorf("%w: health margin %v", ErrInvalidArgument, margin)
	}
	return &Health{margin: margin, locks: make(map[string]*Lock)}, nil
}

// Track adds l to the check, in place of any lock of its name (with Run,
// track each new holding as fn starts). A released lock stops counting; a
// lost one fails the check until replaced or forgotten.
func (h *Health) Track(l *Lock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.locks[l.t.name()] = l
}

// Forget stops checking the lock name.
func (h *Health) Forget(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.locks, name)
}

// Check returns nil while every tracked lock is held and its session
// renewed within the margin, and an error naming each lock that is not.
func (h *Health) Check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	now := time.Now()
	for name, l := range h.locks {
		switch err := l.Err(); {
		case errors.Is(err, ErrLost):
			errs = append(errs, fmt.Errorf("lock %q (token %d) lost: %w", name, l.t.token, err))
		case err != nil: // released: nothing to watch any more
			delete(h.locks, name)
		default:
			last := l.t.s.lastSent()
			if silent := now.Sub(last); silent > h.margin {
				errs = append(errs, fmt.Errorf("lock %q (token %d): session not renewed for %v (margin %v)",
					name, l.t.token, silent.Round(time.Millisecond), h.margin))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return failed("health", errors.Join(errs...))
}

// ServeHTTP answers 200 "ok" while Check passes, else 503 with its error.
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := h.Check(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintln(w, "ok")
}
