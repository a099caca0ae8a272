//go:build !leasefence_mutants

package lease

import "time"

// clock is a session's local time. Safety never rests on it (the fence
// does), but the early loss signal does. Release builds run on the real
// clock; the fault suite runs it slow or fast under the build tag
// leasefence_mutants (ownership_mutants.go). It is the renewer's
// renew.Clock.
type clock struct{}

func (clock) Now() time.Time { return time.Now() }

// Real is how long d on this clock lasts in real time.
func (clock) Real(d time.Duration) time.Duration { return d }

// Scale is how much of this clock's time d of real time is.
func (clock) Scale(d time.Duration) time.Duration { return d }
