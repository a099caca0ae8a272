//go:build leasefence_mutants

package lease

import (
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/leasefence/leasefence/internal/seam"
)

// This file exists only under the build tag leasefence_mutants: the fault
// suite's deliberate bugs inside the lock's own checks, and its scaled
// clock. ownership.go has the plain forms that release builds compile.

// faultSeam carries the deliberate bug a session runs with.
type faultSeam struct{ mutant seam.Mutant }

// WithMutant switches on a deliberate bug, for the fault suite to show that
// it catches it. Only the mutants that live inside the lock's checks are
// accepted; the others are built by the tests themselves.
func WithMutant(m seam.Mutant) Option {
	return func(o *options) error {
		switch m {
		case seam.None, seam.SessionOnlyOwnership, seam.RequestedTTL, seam.DroppedWake:
			o.seam.mutant = m
			return nil
		}
		return fmt.Errorf("%w: mutant %q does not live in package lease", ErrInvalidArgument, m)
	}
}

// WithClockRate runs the session's local clock at rate times real time:
// 0.5 makes its deadlines fire late, 2 early.
func WithClockRate(rate float64) Option {
	return func(o *options) error {
		if rate <= 0 {
			return fmt.Errorf("%w: clock rate %v", ErrInvalidArgument, rate)
		}
		o.clock = newScaledClock(rate)
		return nil
	}
}

func (t *tracker) owns(kv *mvccpb.KeyValue) bool {
	if t.s.seam.mutant == seam.SessionOnlyOwnership {
		return true
	}
	return kv != nil && kv.CreateRevision == t.token && kv.Lease == int64(t.s.id) && modeOf(kv) == t.mode
}

func (o *options) grantedTTL(seconds int64) time.Duration {
	if o.seam.mutant == seam.RequestedTTL {
		return time.Duration(ttlSeconds(o.ttl)) * time.Second
	}
	return time.Duration(seconds) * time.Second
}

func (s *Session) renewedTTL(seconds int64) time.Duration {
	if s.seam.mutant == seam.RequestedTTL {
		return s.ttl
	}
	return time.Duration(seconds) * time.Second
}

// clock runs at rate times real time from origin; the zero clock is the
// real one.
type clock struct {
	origin time.Time
	rate   float64
}

func newScaledClock(rate float64) clock { return clock{origin: time.Now(), rate: rate} }

func (c clock) Now() time.Time {
	if c.rate == 0 {
		return time.Now()
	}
	return c.origin.Add(time.Duration(float64(time.Since(c.origin)) * c.rate))
}

func (c clock) Real(d time.Duration) time.Duration {
	if c.rate == 0 {
		return d
	}
	return time.Duration(float64(d) / c.rate)
}

func (c clock) Scale(d time.Duration) time.Duration {
	if c.rate == 0 {
		return d
	}
	return time.Duration(float64(d) * c.rate)
}
