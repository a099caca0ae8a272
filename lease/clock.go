package lease

import "time"

// clock is the session's source of local time. Safety never depends on it
// (the fence does), but the early loss signal does; tests replace it to run
// the library's clock slow or fast (ownership_mutants.go, under the
// leasefence_mutants build tag). It is an internal construction option:
// options.clock.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

type timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }
